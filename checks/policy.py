"""Verdicts per variant and per template, and the one-sentence summary a user can act on.

A pair that fails (history, generation_prompt, dropped reasoning, token seam) makes its variant
`unsafe`; a reply written back with different framing is a warning only (see docs/engine.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable

from checks.figures import broken_pairs, setting_figure, share_figure
from checks.reports import (
    ASSISTANT_OUTPUT,
    ERROR,
    GENERATION_PROMPT,
    HISTORY,
    SAFE,
    SAFE_WHERE_RENDERABLE,
    TOKEN_SEAM,
    UNSAFE,
    ClientResult,
    Failure,
    RequestPair,
    SessionResult,
    VariantResult,
)
from checks.reuse import CACHE_CLASSES, HYBRID, TRIMMABLE
from checks.sources import DEFAULT, TOOL_USE, has_default


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


def engine_verdicts(sessions: Iterable[SessionResult]) -> dict[str, str]:
    """Per engine cache class: `unsafe` when some turn reuses less than the class keeps if only
    the reply is lost (checks.reuse.bar), else as the prompt-reuse verdict."""
    sessions = list(sessions)
    headline = variant_verdict(sessions)
    if headline == ERROR:
        return dict.fromkeys(CACHE_CLASSES, ERROR)
    pairs = [p for s in sessions if s.rendered for p in s.pairs]
    out = {}
    for cache_class in CACHE_CLASSES:
        counts = [
            ((p.reuse or {}).get(cache_class), (p.needed or {}).get(cache_class)) for p in pairs
        ]
        if cache_class == TRIMMABLE or any(got is None or need is None for got, need in counts):
            # Without token counts a block cache is judged like a trimmable one: a divergence
            # inside the last block could only make it safer.
            out[cache_class] = headline
            continue
        lost = any(got < need for got, need in counts if got is not None and need is not None)
        out[cache_class] = UNSAFE if lost else headline
    return out


def client_result(
    profile: str, sessions: tuple[SessionResult, ...], note: str, *, keep_sessions: bool
) -> ClientResult:
    """One client profile's verdicts and costs over its sessions."""
    pairs = [p for s in sessions if s.rendered for p in s.pairs]
    shares: dict[str, float | None] = {}
    for cache_class in CACHE_CLASSES:
        counts = [((p.reuse or {}).get(cache_class), p.next_units) for p in pairs]
        ratios = [got / size for got, size in counts if got is not None and size]
        shares[cache_class] = round(sum(ratios) / len(ratios), 4) if ratios else None
    lost = [p for p in pairs if p.status == "reply"]
    reply_units = [
        p.held_units - p.prompt_units
        for p in lost
        if p.held_units is not None and p.prompt_units is not None
    ]
    return ClientResult(
        profile=profile,
        verdict=variant_verdict(sessions),
        note=note,
        engines=engine_verdicts(sessions),
        reuse_share=shares,
        reply_reused=None if not pairs else not lost,
        reply_units=round(sum(reply_units) / len(reply_units), 1) if reply_units else None,
        unit=pairs[0].unit if pairs else "bytes",
        sessions=sessions if keep_sessions else (),
    )


def not_applicable(profile: str, note: str) -> ClientResult:
    return ClientResult(profile, None, note, {}, {}, None, None, "bytes")


def mean_share(sessions: Iterable[SessionResult]) -> float | None:
    """A setting's "Reused" figure (`checks.figures.setting_figure`)."""
    figure = setting_figure(sessions)
    return figure.mean if figure is not None else None


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
    return broken_pairs(variant.sessions)


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


def kwargs_hint(variant: VariantResult, nothing: str = "the default settings") -> str:
    """What a caller passes to get this setting: the template it names and the kwargs, else
    `nothing`."""
    settings = f"chat_template_kwargs={json.dumps(variant.kwargs)}" if variant.kwargs else ""
    if variant.template_name != DEFAULT:  # a template the caller names
        return " and ".join(filter(None, (f'chat_template="{variant.template_name}"', settings)))
    return settings or nothing


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
        parts = [f"Cache-safe in every session we replayed, {scope}, for the typical setup."]
    elif verdict == SAFE_WHERE_RENDERABLE:
        parts = [f"Cache-safe wherever it renders; the template refuses {_refused(usable)}."]
    elif best is not None:
        parts = [f"Cache-safe with {best.label} (pass {kwargs_hint(best)})."]
    else:
        parts = ["Not cache-safe under any setting checked."]
    for variant in unsafe[:3]:
        pairs = _failing_pairs(variant)
        kept = share_figure(pairs)
        assert kept is not None  # an unsafe setting has a failing pair
        intro = f"With {variant.label}" if len(variants) > 1 else "On each such turn"
        baseline = ""
        same = share_figure(_same_pairs(best, pairs)) if best is not None else None
        if best is not None and same is not None:
            baseline = f", against {same.text} on the same turns with {best.label}"
        parts.append(
            f"{intro}, {_cause_phrase(pairs)} ({_sessions_phrase(pairs)}): only about "
            f"{kept.text} of the next prompt can come from the cache ({kept.over_breaks})"
            f"{baseline}."
        )
    if len(unsafe) > 3:
        parts.append(f"{len(unsafe) - 3} more settings break the same way.")
    headline = next((v for v in usable if is_primary(v)), usable[0] if usable else None)
    if headline is not None:
        parts += setup_sentences(headline)
    warnings = [p for v in usable for s in v.sessions for p in s.pairs if p.status == "warn"]
    if warnings:
        parts.append(
            f"Note: {warnings[0].detail} ({warnings[0].session}); whether that costs a cache "
            "hit depends on what the model really emits."
        )
    return " ".join(parts)


def no_default_sentence(names: Collection[str]) -> str:
    """What a caller of named templates none of which is `default` must know first."""
    named = " or ".join(f'"{name}"' for name in sorted(names))
    if TOOL_USE in names:
        return (
            "No default template: transformers renders a request without tools only when the "
            f'caller names a template (chat_template={named}); with tools it uses "{TOOL_USE}".'
        )
    return (
        "No default template: transformers renders a request only when the caller names a "
        f"template (chat_template={named})."
    )


def judge(
    variants: tuple[VariantResult, ...], names: Collection[str]
) -> tuple[str, str, str | None]:
    """The headline verdict, its summary and (errors only) the reason.

    Named templates with no `default`: a caller who names none gets an error for some requests
    (every one without `tool_use`), so the verdict is what the names render, at best safe where
    it renders, and the summary says first that a name is needed."""
    judged = variants
    if not has_default(names):
        judged = tuple(v for v in variants if v.template_name != DEFAULT)
    verdict = template_verdict(judged)
    summary = summarize(verdict, judged)
    reason = error_reason(judged) if verdict == ERROR else None
    if judged is not variants:
        verdict, summary = without_default(verdict), f"{no_default_sentence(names)} {summary}"
    return verdict, summary, reason


def without_default(verdict: str) -> str:
    """The verdict of named templates none of which is `default`, from the worst of them: a
    caller who names none gets an error for some requests, so safe at best where it renders."""
    return SAFE_WHERE_RENDERABLE if verdict == SAFE else verdict


_CLIENT_WORDS = {
    "reasoning_content": "a client that sends reasoning back as reasoning_content",
    "thinking_chunks": "a client that sends reasoning back as thinking chunks",
    "arguments_objects": "tool-call arguments passed as objects",
    "arguments_strings": "tool-call arguments passed as JSON strings",
}


def _units(value: float, unit: str) -> str:
    return f"about {round(value)} {unit}"


def setup_sentences(variant: VariantResult) -> list[str]:
    """What the typical setup costs beyond the prompt, and which other clients and engines
    differ: plain sentences for the summary, from the variant's measured results."""
    if not variant.clients or variant.verdict == ERROR:
        return []
    typical = variant.clients[0]
    parts = []
    if typical.reply_reused is False and typical.reply_units is not None:
        lost = [p for s in variant.sessions for p in s.pairs if p.status == "reply"]
        parts.append(
            f"The prompt carries over, but the model's reply does not ({lost[0].detail}; "
            f"{_sessions_phrase(lost)}): on a trimmable cache each such turn re-reads the reply, "
            f"{_units(typical.reply_units, typical.unit)}."
        )
    engines = typical.engines
    if engines.get(HYBRID) == UNSAFE and engines.get(TRIMMABLE) != UNSAFE:
        parts.append(
            "On a hybrid model without cache checkpoints (Qwen3-Next, Mamba, LFM2 on mlx-lm's "
            "sequential path or llama.cpp without checkpoints) those turns re-read everything."
        )
    worse = [
        c
        for c in variant.clients[1:]
        if c.verdict is not None and c.verdict == UNSAFE and typical.verdict != UNSAFE
    ]
    better = [
        c
        for c in variant.clients[1:]
        if c.verdict is not None and typical.verdict == UNSAFE and c.verdict != UNSAFE
    ]
    if worse:
        names = " or ".join(_CLIENT_WORDS.get(c.profile, c.profile) for c in worse)
        pairs = [p for c in worse for s in c.sessions for p in s.pairs if p.status == "fail"]
        why = f" ({_cause_phrase(pairs)}, {_sessions_phrase(pairs)})" if pairs else ""
        parts.append(f"With {names}, the prompt breaks{why}.")
    whole = [c for c in better if c.verdict == SAFE]
    partly = [c for c in better if c.verdict != SAFE]
    if whole:
        names = " or ".join(_CLIENT_WORDS.get(c.profile, c.profile) for c in whole)
        parts.append(f"With {names}, it is cache-safe.")
    if partly:
        # Not advice to follow as it is: the template refuses some conversations that way.
        names = " or ".join(_CLIENT_WORDS.get(c.profile, c.profile) for c in partly)
        parts.append(
            f"With {names}, it is cache-safe only in the conversations that render: the "
            "template refuses the others."
        )
    return parts


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
