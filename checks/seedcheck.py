"""The blog post's "5-minute check", applied literally, with each of its failures classified.

It compares render(msgs[:-1]) with render(msgs), both with the generation prompt. When the appended
message is a tool result or a user turn, the shorter render ends in an assistant generation prompt
that no real request is followed by: most of its tool-shape failures are that artifact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from checks.comparison import byte_length, common_prefix, history_end
from checks.reports import SeedShapeResult

# Messages exactly as in the post (string arguments, ids "c1"/"c2", empty content on tool calls).
SEED_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
SEED_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
_USER1 = {"role": "user", "content": "What's the weather in NYC?"}
_ASST_TEXT = {"role": "assistant", "content": "It's sunny."}
_CALL1 = {
    "id": "c1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "NYC"}'},
}
_CALL2 = {
    "id": "c2",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "LA"}'},
}
_ASST_TOOL = {"role": "assistant", "content": "", "tool_calls": [_CALL1]}
_ASST_PARALLEL = {"role": "assistant", "content": "", "tool_calls": [_CALL1, _CALL2]}
_TOOL_RESP = {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 72}'}
_USER2 = {"role": "user", "content": "And tomorrow?"}

SEED_SHAPES: dict[str, tuple[list[dict[str, Any]], bool]] = {
    "pure_chat": ([SEED_SYSTEM, _USER1, _ASST_TEXT], False),
    "with_tools": ([SEED_SYSTEM, _USER1, _ASST_TEXT], True),
    "single_tool_call": ([SEED_SYSTEM, _USER1, _ASST_TOOL, _TOOL_RESP], True),
    "parallel_tool_call": ([SEED_SYSTEM, _USER1, _ASST_PARALLEL, _TOOL_RESP], True),
    "tool_resp_as_final": ([SEED_SYSTEM, _USER1, _ASST_TOOL, _TOOL_RESP, _USER2], True),
}

GENERATION_PROMPT_ARTIFACT = "generation_prompt_artifact"

# render(messages, tools, add_generation_prompt) -> text; raises on a template error.
RenderFn = Callable[[list[dict[str, Any]], list[dict[str, Any]], bool], str]


def run_seed_check(render: RenderFn, variant_label: str) -> list[SeedShapeResult]:
    """The five shapes, compared as the post does (it passes `tools or []`, so [] when absent)."""
    results = []
    for shape, (messages, with_tools) in SEED_SHAPES.items():
        tools = SEED_TOOLS if with_tools else []
        try:
            prev = render(messages[:-1], tools, True)
            full = render(messages, tools, True)
        except Exception as exc:  # noqa: BLE001 - a template error is this shape's result
            error = f"{type(exc).__name__}: {exc}"
            results.append(SeedShapeResult(shape, variant_label, "error", None, None, 0, 0, error))
            continue
        offset = common_prefix(prev, full)
        if offset == len(prev):
            results.append(
                SeedShapeResult(
                    shape,
                    variant_label,
                    "ok",
                    None,
                    None,
                    byte_length(prev),
                    byte_length(full),
                    None,
                )
            )
            continue
        classification = _classify(render, messages, tools, prev, full, offset)
        results.append(
            SeedShapeResult(
                shape,
                variant_label,
                "fail",
                classification,
                byte_length(prev[:offset]),
                byte_length(prev),
                byte_length(full),
                None,
            )
        )
    return results


def _classify(
    render: RenderFn,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    prev: str,
    full: str,
    offset: int,
) -> str:
    try:
        history = render(messages[:-1], tools, False)
    except Exception:  # noqa: BLE001 - cannot separate history from prompt
        return "history"
    # A generation prompt that rewrites the latest message is an edit of history where the shorter
    # render is a request (it ends on a user or tool message); after the assistant's own message
    # the rewrite is the artifact's doing, as no request ends there.
    if messages[-2]["role"] != "assistant":
        end = history_end(history, prev, full)
    else:
        end = common_prefix(history, prev)
    if offset < end:
        return "history"
    if messages[-1]["role"] != "assistant":
        # The shorter render asks the model to answer, but the next message is not its answer.
        return GENERATION_PROMPT_ARTIFACT
    return "generation_prompt"
