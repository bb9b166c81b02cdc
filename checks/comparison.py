"""Compare request k with request k+1 of a session; say what breaks the prefix
(docs/engine.md)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from checks.attribution import Span, span_at
from checks.reports import (
    ASSISTANT_OUTPUT,
    GENERATION_PROMPT,
    HISTORY,
    TOKEN_SEAM,
    Divergence,
    RequestPair,
)

# A generation prompt that already closes a think block means the model will not emit reasoning.
_CLOSED_THINKING = re.compile(r"</[^<>]*think[^<>]*>", re.IGNORECASE)
_THINK_TAG = re.compile(r"</?[^<>\s/]{0,24}think[^<>\s]{0,24}>", re.IGNORECASE)
CONTEXT_CHARS = 40


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    if b.startswith(a):
        return len(a)
    low, high = 0, min(len(a), len(b))
    # Binary search on slice equality is far faster in CPython than a character loop.
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def common_prefix_tokens(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def history_end(history: str, prompt: str, following: str) -> int:
    """Where a divergence of `prompt` from `following` stops being in history: the render without
    the generation prompt (`history`) agrees with either render up to there.

    A generation prompt may rewrite the latest turn too (a marker on the last user message only
    when the model is asked to answer); the next render then writes that turn as `history` does,
    so the divergence is in that turn, not in the generation prompt."""
    return max(common_prefix(history, prompt), common_prefix(history, following))


def byte_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass
class PairInput:
    """What the comparison needs about one pair; the renders it may need later come lazily."""

    session: str
    index: int
    prompt: str  # P_k: request k with the generation prompt
    next_prompt: str  # P_k+1
    reply: dict[str, Any]  # the assistant message the model emitted between the two
    model_reasons: bool  # would the model emit reasoning after this generation prompt
    history: Callable[[], str]  # B_k: request k without the generation prompt
    spans: Callable[[int], tuple[list[Span], list[Span]]]  # attribution of P_k, P_k+1 up to n
    tokens: Callable[[str], list[int]] | None = None
    check_tool_calls: bool = True  # False when the template never reads tool_calls
    #: The reply as the engine holds it after generating: what the template writes for that turn
    #: after request k's prompt, up to the end-of-turn token (see engine.emitted_reply).
    emitted: str = ""
    client_drops_reasoning: bool = False  # the client, not the template, leaves reasoning out


def generation_prompt_closes_thinking(generation_prompt: str) -> bool:
    return bool(_CLOSED_THINKING.search(generation_prompt))


def generation_prompt_opens_thinking(generation_prompt: str) -> bool:
    """Does the prompt end inside an opened think block, so the model must emit reasoning?"""
    tags = _THINK_TAG.findall(generation_prompt)
    return bool(tags) and not tags[-1].startswith("</")


#: The segment of a divergence that attribution could not place (its spans are best effort).
UNATTRIBUTED = "unknown"


def _divergence(
    pair: PairInput,
    offset: int,
    history_end: int,
    token_index: int | None,
) -> Divergence:
    before_spans, after_spans = pair.spans(offset + 1)
    span_before = span_at(before_spans, offset) if offset < len(pair.prompt) else None
    span_after = span_at(after_spans, offset)
    if offset >= len(pair.prompt):
        segment_before = "end of request"
    elif offset >= history_end:
        segment_before = "generation prompt"
    else:
        segment_before = span_before.segment if span_before else UNATTRIBUTED
    return Divergence(
        byte_offset=byte_length(pair.prompt[:offset]),
        char_offset=offset,
        token_index=token_index,
        segment_before=segment_before,
        segment_after=span_after.segment if span_after else "end of request",
        lines_before=(span_before.line,) if span_before and span_before.line else (),
        lines_after=(span_after.line,) if span_after and span_after.line else (),
        text_before=pair.prompt[offset : offset + CONTEXT_CHARS],
        text_after=pair.next_prompt[offset : offset + CONTEXT_CHARS],
    )


def _named(segment: str) -> str:
    return {"tools": "the tools block", "system": "the system prompt"}.get(segment, segment)


def _reply_check(pair: PairInput) -> tuple[str, str, int] | None:
    """When P_k is a prefix of P_k+1: does the continuation start with the reply as emitted?

    Returns (status, detail, reusable_end) for a problem, None when the reply is written back as is.
    """
    continuation = pair.next_prompt[len(pair.prompt) :]
    reasoning = pair.reply.get("reasoning_content") or ""
    content = pair.reply.get("content") or ""
    # A call is written back in the reply's own turn (as long as the template writes that turn
    # when it is the last, `emitted`), not anywhere later: a tool result often names its tool.
    own_turn = continuation[: len(pair.emitted)] if pair.emitted else continuation
    for call in (pair.reply.get("tool_calls") or []) if pair.check_tool_calls else []:
        name = call.get("function", {}).get("name", "")
        if name and name not in own_turn:
            return "fail", f"the tool call to {name} is not written back into history", 0
    start = 0
    if pair.model_reasons and reasoning:
        found = continuation.find(reasoning)
        if found < 0:
            if pair.client_drops_reasoning:
                return "fail", "the client does not send back the reasoning the model emitted", 0
            return "fail", "the reasoning the model emitted is dropped from history", 0
        start = found + len(reasoning)
    if not content:
        return None
    found = continuation.find(content, start)
    if found < 0:
        stripped = content.strip()
        if stripped and continuation.find(stripped, start) >= 0:
            at = continuation.find(stripped, start)
            return "warn", "history trims whitespace the model emitted around its reply", at
        return "fail", "the reply content is not written back into history", 0
    frame = continuation[start:found]
    if frame and not (pair.model_reasons and reasoning):
        shown = frame if len(frame) <= 40 else frame[:37] + "..."
        return "warn", f"history writes {shown!r} before the reply, not part of the prompt", found
    return None


def compare_pair(pair: PairInput) -> RequestPair:
    """Classify one request pair: pass, warn (assistant_output) or fail, with the divergence."""
    prompt, nxt = pair.prompt, pair.next_prompt
    offset = common_prefix(prompt, nxt)
    next_bytes = byte_length(nxt)
    prompt_tokens = next_tokens = None
    token_index = None
    token_share = None
    if pair.tokens is not None:
        prompt_tokens, next_tokens = pair.tokens(prompt), pair.tokens(nxt)
        token_index = common_prefix_tokens(prompt_tokens, next_tokens)
        token_share = token_index / len(next_tokens) if next_tokens else 1.0

    def share(chars: int) -> float:
        return byte_length(nxt[:chars]) / next_bytes if next_bytes else 1.0

    def result(
        status: str, cause: str | None, detail: str, divergence: Divergence | None, reusable: int
    ) -> RequestPair:
        return RequestPair(
            session=pair.session,
            index=pair.index,
            status=status,
            cause=cause,
            detail=detail,
            divergence=divergence,
            prefix_bytes=byte_length(prompt),
            next_bytes=next_bytes,
            reusable_share=round(share(reusable), 4),
            token_reusable_share=None if token_share is None else round(token_share, 4),
            prompt_reuse=status != "fail",
            reply_reuse=status in ("pass", "warn"),
        )

    if offset < len(prompt):
        boundary = history_end(pair.history(), prompt, nxt)
        divergence = _divergence(pair, offset, boundary, token_index)
        if offset < boundary:
            what = _named(divergence.segment_before)
            if divergence.segment_before == UNATTRIBUTED:
                what = f"the history, from byte {divergence.byte_offset},"
            detail = f"{what} is written differently once a turn is added"
            return result("fail", HISTORY, detail, divergence, offset)
        detail = (
            f"the generation prompt {prompt[boundary:]!r} is not what history writes "
            "for that assistant turn"
        )
        return result("fail", GENERATION_PROMPT, detail, divergence, offset)
    problem = _reply_check(pair)
    seam = (
        prompt_tokens is not None and token_index is not None and token_index < len(prompt_tokens)
    )
    if seam:
        # Checked even when the reply is only reframed (a warning): bytes history adds after the
        # generation prompt, such as a '\n', are exactly what merges across the seam, and a
        # broken token prefix costs the re-prefill whatever the model emits.
        divergence = _divergence(pair, len(prompt), len(prompt), token_index)
        detail = (
            f"bytes match but tokens do not: token {token_index} of request {pair.index} "
            "merges across the seam with what follows"
        )
        if problem is not None:
            detail += f" (and {problem[1]})"
        return result("fail", TOKEN_SEAM, detail, divergence, len(prompt))
    # The prompt carries over. Does the reply, as the engine holds it?
    held = prompt + pair.emitted
    held_end = common_prefix(held, nxt)
    reply_kept = held_end == len(held)
    if reply_kept and pair.tokens is not None and next_tokens is not None:
        held_tokens = pair.tokens(held)
        reply_kept = common_prefix_tokens(held_tokens, next_tokens) == len(held_tokens)
    if problem is not None and problem[0] == "fail":
        _, detail, _ = problem
        divergence = _divergence(pair, len(prompt), len(prompt), None)
        return result("reply", ASSISTANT_OUTPUT, detail, divergence, len(prompt))
    if not reply_kept:
        at = min(held_end, len(nxt))
        divergence = _divergence(pair, at, len(prompt), None)
        emitted_text, history_text = held[at : at + 24], nxt[at : at + 24]
        detail = (
            f"history writes the reply differently from how the model emits it: "
            f"{history_text!r} where the model emitted {emitted_text!r}"
            if held_end < len(held)
            else "the reply's bytes are written back, but its last token merges with what follows"
        )
        return result("reply", ASSISTANT_OUTPUT, detail, divergence, max(at, len(prompt)))
    if problem is not None:
        status, detail, reply_offset = problem
        at = len(prompt) + reply_offset
        divergence = _divergence(pair, at, len(prompt), None)
        return result(status, ASSISTANT_OUTPUT, detail, divergence, at)
    return result("pass", None, "", None, max(held_end, len(prompt)))
