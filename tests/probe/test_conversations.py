"""The probe takes the check engine's sessions as plain data, cut into the same requests."""

from __future__ import annotations

import pytest

from checks.conversations import SESSIONS, TOOLS, Session
from probe.runner import parse_conversations, session_requests


@pytest.mark.parametrize("session", SESSIONS, ids=lambda s: s.name)
def test_sessions_cut_like_the_check_engine(session: Session) -> None:
    messages = list(session.messages)
    ends = session.request_ends()
    assert [len(r) for r in session_requests(messages)] == ends
    if len(ends) < 2:
        return
    tools = TOOLS if session.uses_tools else None
    job = {"conversations": {"s": {"messages": messages, "tools": tools}}}
    requests = parse_conversations(job)["s"]
    assert [r.messages for r in requests] == [messages[:end] for end in ends]
    assert all(r.tools == tools for r in requests)


def test_other_shapes() -> None:
    r1 = [{"role": "user", "content": "a"}]
    r2 = [*r1, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert len(parse_conversations({"conversations": {"x": [r1, r2]}})["x"]) == 2
    with pytest.raises(ValueError, match="at least two requests"):
        parse_conversations({"conversations": {"x": [r1]}})
    with pytest.raises(ValueError, match="list of messages"):
        parse_conversations({"conversations": {"x": {"messages": "nope"}}})
    with pytest.raises(ValueError, match="dict with a role"):
        parse_conversations({"conversations": {"x": {"messages": [*r2, {"content": "d"}]}}})
