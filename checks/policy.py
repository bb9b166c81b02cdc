"""Verdicts per variant and per template, and the one-sentence summary a user can act on.

A pair that fails (history, generation_prompt, dropped reasoning, token seam) makes its variant
`unsafe`; a reply written back with different framing is a warning only (see docs/engine.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

from checks.reports import (
    ASSISTANT_OUTPUT,
    ERROR,
    GENERATION_PROMPT,
    HISTORY,
    SAFE,
    SAFE_WHERE_RENDERABLE,
    TOKEN_SEAM,
    UNSAFE,
    Failure,
    RequestPair,
    SessionResult,
    VariantResult,
)


def variant_verdict(sessions: Iterable[SessionResult]) -> str:
    sessions = list(sessions)
    rendered = [s for s in sessions if s.rendered]
    if not rendered:
        return ERROR
    if any(p.status == "fail" for s in rendered for p in s.pairs):
        return UNSAFE
    if len(rendered) < len(sessions):
        return SAFE_WHERE_RENDERABLE
    return SAFE


def mean_share(sessions: Iterable[SessionResult]) -> float | None:
    shares = [p.reusable_share for s in sessions for p in s.pairs]
    return round(sum(shares) / len(shares), 4) if shares else None


# Settings every caller meets: no kwargs, or the enable_thinking switch serving engines pass.
# Opt-in kwargs (preserve_thinking, reasoning_effort, …) are reported per variant and in the
# summary, but do not decide the headline verdict.
PRIMARY_KWARGS = frozenset({"enable_thinking"})


def is_primary(variant: VariantResult) -> bool:
    return set(variant.kwargs) <= PRIMARY_KWARGS


def template_verdict(variants: Iterable[VariantResult]) -> str:
    """The headline verdict, from the primary variants (all variants if none of those render)."""
    variants = list(variants)
    primary = [v for v in variants if is_primary(v) and v.verdict != ERROR]
    found = {v.verdict for v in (primary or variants)}
    if not found or found == {ERROR}:
        return ERROR
    if UNSAFE in found:
        return UNSAFE
    if SAFE_WHERE_RENDERABLE in found or ERROR in found:
        return SAFE_WHERE_RENDERABLE
    return SAFE


def error_reason(variants: Iterable[VariantResult]) -> str:
    errors = Counter(
        s.error for v in variants for s in v.sessions if not s.rendered and s.error is not None
    )
    return errors.most_common(1)[0][0] if errors else "nothing renders"


def _failing_pairs(variant: VariantResult) -> list[RequestPair]:
    return [p for s in variant.sessions for p in s.pairs if p.status == "fail"]


_CAUSE_TEXT = {
    HISTORY: "earlier messages are re-rendered when a turn is added",
    GENERATION_PROMPT: "the generation prompt is not what history writes for that turn",
    ASSISTANT_OUTPUT: "the reply the model emitted is not written back as it was",
    TOKEN_SEAM: "tokens merge across the turn boundary although the bytes match",
}


def _same_pairs(variant: VariantResult, pairs: list[RequestPair]) -> list[RequestPair]:
    """The pairs of `variant` at the same (session, index) as `pairs`: a like-for-like baseline."""
    wanted = {(p.session, p.index) for p in pairs}
    return [p for s in variant.sessions for p in s.pairs if (p.session, p.index) in wanted]


# The detail of a history break caused by the clock (engine.CLOCK_STEP): the time of day that
# strftime_now writes differs between two requests sent minutes apart.
CLOCK_DETAIL = "the time strftime_now writes changes between requests"


def _cause_phrase(pairs: list[RequestPair]) -> str:
    cause, _ = Counter(p.cause for p in pairs).most_common(1)[0]
    if cause == HISTORY and any(p.detail.startswith(CLOCK_DETAIL) for p in pairs):
        return CLOCK_DETAIL
    if cause == ASSISTANT_OUTPUT:
        return pairs[[p.cause for p in pairs].index(cause)].detail
    return _CAUSE_TEXT.get(cause or "", "the prompt changes")


def _sessions_phrase(pairs: list[RequestPair]) -> str:
    names = list(dict.fromkeys(p.session for p in pairs))
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"session{'s' if len(names) > 1 else ''} {shown}"


def _percent(share: float) -> str:
    return f"{round(share * 100)}%"


def _kwargs_hint(variant: VariantResult) -> str:
    if not variant.kwargs:
        return "the default settings"
    return f"chat_template_kwargs={json.dumps(variant.kwargs)}"


def _refused(variants: list[VariantResult]) -> str:
    """The sessions a template refuses, with its most common reason."""
    refused = [s for v in variants for s in v.sessions if not s.rendered]
    names = sorted({s.session for s in refused})
    reason, _ = Counter(s.error for s in refused).most_common(1)[0]
    # "dict arguments: X; string arguments: X" says the same thing twice.
    reason = (reason or "").split("; string arguments: ")[0].removeprefix("dict arguments: ")
    return f"{', '.join(names)} ({reason})"


def summarize(verdict: str, variants: tuple[VariantResult, ...]) -> str:
    """One or a few plain sentences a user can act on, built from measured results only."""
    usable = [v for v in variants if v.verdict != ERROR]
    if verdict == ERROR:
        return f"Nothing renders: {error_reason(variants)}."
    safe = [v for v in usable if v.verdict in (SAFE, SAFE_WHERE_RENDERABLE)]
    unsafe = [v for v in usable if v.verdict == UNSAFE]
    best = max(safe, key=lambda v: v.mean_reusable_share or 0.0) if safe else None
    if verdict == SAFE:
        scope = "under every setting checked" if not unsafe else "with the default settings"
        parts = [f"Cache-safe in every session we replayed, {scope}."]
    elif verdict == SAFE_WHERE_RENDERABLE:
        parts = [f"Cache-safe wherever it renders; the template refuses {_refused(usable)}."]
    elif best is not None:
        parts = [f"Cache-safe with {best.label} (pass {_kwargs_hint(best)})."]
    else:
        parts = ["Not cache-safe under any setting checked."]
    for variant in unsafe[:3]:
        pairs = _failing_pairs(variant)
        kept = sum(p.reusable_share for p in pairs) / len(pairs)
        intro = f"With {variant.label}" if len(variants) > 1 else "On each such turn"
        baseline = ""
        same_turns = _same_pairs(best, pairs) if best is not None else []
        if best is not None and same_turns:
            best_kept = sum(p.reusable_share for p in same_turns) / len(same_turns)
            baseline = f", against {_percent(best_kept)} on the same turns with {best.label}"
        parts.append(
            f"{intro}, {_cause_phrase(pairs)} ({_sessions_phrase(pairs)}): only about "
            f"{_percent(kept)} of the next prompt can come from the cache{baseline}."
        )
    if len(unsafe) > 3:
        parts.append(f"{len(unsafe) - 3} more settings break the same way.")
    warnings = [p for v in usable for s in v.sessions for p in s.pairs if p.status == "warn"]
    if warnings:
        parts.append(
            f"Note: {warnings[0].detail} ({warnings[0].session}); whether that costs a cache "
            "hit depends on what the model really emits."
        )
    return " ".join(parts)


def failure_rows(variants: Iterable[VariantResult]) -> tuple[Failure, ...]:
    rows = []
    for variant in variants:
        for session in variant.sessions:
            for pair in session.pairs:
                if pair.status == "pass":
                    continue
                div = pair.divergence
                rows.append(
                    Failure(
                        variant=variant.label,
                        session=session.session,
                        request_index=pair.index,
                        status=pair.status,
                        cause=pair.cause or "",
                        byte_offset=div.byte_offset if div else None,
                        token_index=div.token_index if div else None,
                        segment=div.segment_before if div else None,
                        segment_next=div.segment_after if div else None,
                        template_lines=(
                            tuple(dict.fromkeys(div.lines_before + div.lines_after)) if div else ()
                        ),
                        detail=pair.detail,
                    )
                )
    return tuple(rows)
