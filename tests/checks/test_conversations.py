"""The named sessions the engine, the probe and the pages share."""

from __future__ import annotations

from checks.conversations import SESSION_NAMES, session_named


def test_sessions_split_into_requests_and_replies() -> None:
    assert SESSION_NAMES == (
        "chat",
        "chat_no_system",
        "chat_with_tools",
        "tool_round",
        "parallel_tool_calls",
        "tool_rounds",
        "reasoning_history",
        "reasoning_tool_round",
        "padded_content",
    )
    parallel = session_named("parallel_tool_calls")
    requests = parallel.requests()
    # Both tool results belong to one request: the model answers only after the second.
    assert [m["role"] for m in requests[1][-3:]] == ["assistant", "tool", "tool"]
    assert [r["role"] for r in parallel.replies()] == ["assistant", "assistant"]
    for session in map(session_named, SESSION_NAMES):
        assert all(r[-1]["role"] in ("user", "tool") for r in session.requests())
        assert len(session.replies()) == len(session.requests()) - 1
