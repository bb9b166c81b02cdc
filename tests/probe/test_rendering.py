"""Prompts tokenized as mlx_lm.server does, and the forced replies between requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm
import pytest

from probe.rendering import (
    ChatRequest,
    common_prefix,
    forced_reply,
    parse_request,
    render_prompt,
)
from tests.probe.conftest import weather_conversation


def requests() -> list[ChatRequest]:
    conv = weather_conversation()
    return [ChatRequest(r, conv["tools"]) for r in conv["requests"]]


@pytest.fixture(scope="module")
def qwen3_tokenizer(model_dirs: dict[str, Path]) -> Any:
    return mlx_lm.load(str(model_dirs["llama/qwen3"]))[1]


def test_prompt_matches_the_tokenizer_and_has_server_segments(qwen3_tokenizer: Any) -> None:
    r1 = requests()[0]
    prompt = render_prompt(qwen3_tokenizer, r1)
    expected = qwen3_tokenizer.apply_chat_template(
        r1.messages, tools=r1.tools, add_generation_prompt=True
    )
    assert prompt.tokens == list(expected)
    assert prompt.segment_types == ["system", "user"]
    assert sum(len(s) for s in prompt.segments) == len(prompt.tokens)


def reply_and_reuse(tokenizer: Any, k: int) -> tuple[str, int, int]:
    """Forced reply to request k (decoded), reusable prefix of request k+1, and k's length."""
    current, following = requests()[k], requests()[k + 1]
    prompt = render_prompt(tokenizer, current).tokens
    reply = forced_reply(tokenizer, current, following, prompt)
    assert reply is not None
    reusable = common_prefix(prompt + reply, render_prompt(tokenizer, following).tokens)
    return tokenizer.decode(reply), reusable, len(prompt)


def test_forced_reply_is_the_turn_as_last_message(qwen3_tokenizer: Any) -> None:
    text, reusable, prompt_len = reply_and_reuse(qwen3_tokenizer, 0)
    assert text == "<think>\nLook it up.\n</think>\n\nIt is sunny.<|im_end|>"
    # The template drops that reasoning from history: reuse stops at the <think>.
    assert reusable == prompt_len


def test_forced_reply_with_tool_call_ends_on_end_of_turn(qwen3_tokenizer: Any) -> None:
    text, reusable, prompt_len = reply_and_reuse(qwen3_tokenizer, 1)
    # As the last message the Qwen3 logic writes an empty think block; as history after a
    # tool result it does not: even with no reasoning at all the reply is rewritten.
    assert text.startswith("<think>\n\n</think>\n\n")
    assert text.endswith('"arguments": {"city": "London"}}\n</tool_call><|im_end|>')
    assert reusable == prompt_len


def test_forced_reply_is_kept_by_a_safe_template(model_dirs: dict[str, Path]) -> None:
    tokenizer = mlx_lm.load(str(model_dirs["llama/chatml"]))[1]
    text, reusable, prompt_len = reply_and_reuse(tokenizer, 0)
    assert text.endswith("It is sunny.<|im_end|>")
    reply_len = len(tokenizer.encode(text, add_special_tokens=False))
    assert reusable == prompt_len + reply_len


def test_no_forced_reply_when_history_is_rewritten(qwen3_tokenizer: Any) -> None:
    r1, r2, _ = requests()
    rewritten = ChatRequest([{"role": "system", "content": "other"}, *r2.messages[1:]])
    assert forced_reply(qwen3_tokenizer, r1, rewritten, [1, 2]) is None


def test_parse_request_shapes() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert parse_request(msgs).messages == msgs
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert parse_request({"messages": msgs, "tools": tools}).tools == tools
    with pytest.raises(ValueError, match="non-empty list"):
        parse_request([])
    with pytest.raises(ValueError, match="role"):
        parse_request([{"content": "x"}])
