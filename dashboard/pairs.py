"""The two renders of a request pair, side by side, with the divergence and who wrote each line.

The engine's report keeps only 40 characters around a divergence, so the diff page renders the two
requests again with the engine's own renderer (same sessions, variant and argument form), in the
engine's sandbox with its time, memory and output limits, and caches the result: a template
version never changes, so neither do its renders.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from checks import PairRequest, PairUnavailable, SandboxPool, TemplateSource, render_pair
from checks.comparison import byte_length, common_prefix
from checks.sandbox import SandboxError
from registry.models import TemplateVersion

from .stored_reports import PairLocation

__all__ = ["PairDiff", "PairUnavailable", "RenderLine", "pair_diff"]

CACHE_SECONDS = 24 * 3600
# Special tokens and chat markup worth seeing at a glance: <|im_start|>, <think>, [INST], <s>.
SPECIAL_TOKEN = re.compile(
    r"<\|[^<>\n]{1,60}?\|>|</?(?:think|tool_call|tool_response|s|bos|eos)>|\[/?[A-Z_]{3,24}\]"
)
#: A diff page waits at most this long for its two renders (a check's own limit is similar).
RENDER_SECONDS = 5.0
_pool_lock = threading.Lock()
_web_pool: SandboxPool | None = None


def _pool() -> SandboxPool:
    """One sandbox process per web process, started on the first diff it shows."""
    global _web_pool
    with _pool_lock:
        if _web_pool is None or not _web_pool.usable:
            _web_pool = SandboxPool(size=1)
        return _web_pool


@dataclass(frozen=True)
class RenderLine:
    number: int
    template_lines: tuple[int, ...]
    html: SafeString
    diverges: bool


@dataclass(frozen=True)
class PairDiff:
    before: str
    after: str
    offset: int  # first differing character (len(before) when `before` is a prefix of `after`)
    before_lines: list[RenderLine]
    after_lines: list[RenderLine]
    messages: list[dict[str, Any]]  # the messages of the later request
    reply: dict[str, Any]  # what the model emitted between the two requests

    @property
    def is_prefix(self) -> bool:
        return self.offset >= len(self.before)


def _visible(text: str) -> str:
    """Escape, then make whitespace and special tokens visible (mark_safe only after escape)."""
    out = []
    position = 0
    for match in SPECIAL_TOKEN.finditer(text):
        out.append(shown_controls(_whitespace(escape(text[position : match.start()]))))
        out.append(f'<span class="tok">{escape(match.group())}</span>')
        position = match.end()
    out.append(shown_controls(_whitespace(escape(text[position:]))))
    return "".join(out)


#: Characters that change how text around them is displayed, or show nothing: the bidi
#: embeddings, overrides, isolates and marks, and the zero-width ones. In a template's source
#: an override makes the code read otherwise than it runs ("Trojan Source", CVE-2021-42574).
_CONTROLS = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]")


def shown_controls(escaped: str) -> str:
    """`escaped` (already HTML-escaped) with each of those characters shown by its code point,
    in place of the character (which would act on the page)."""

    def shown(match: re.Match[str]) -> str:
        point = f"U+{ord(match.group()):04X}"
        return f'<span class="ctl" title="{point}">[{point}]</span>'

    return _CONTROLS.sub(shown, escaped)


_WHITESPACE = re.compile(r" +|\t|\r")
_SHOWN = {"\t": "→", "\r": "␍"}


def _whitespace(escaped: str) -> str:
    """Runs of spaces become one muted run of dots (one element per run keeps pages small)."""

    def shown(match: re.Match[str]) -> str:
        text = match.group()
        return f'<span class="ws">{_SHOWN.get(text, "·" * len(text))}</span>'

    return _WHITESPACE.sub(shown, escaped)


def _lines(text: str, spans: list[dict[str, int]], offset: int, side: str) -> list[RenderLine]:
    """Split a render into lines; each knows the template lines that wrote it."""
    rows = []
    start = 0
    number = 1
    marked = False
    for raw in text.splitlines(keepends=True) or [""]:
        end = start + len(raw)
        body, newline = (raw[:-1], True) if raw.endswith("\n") else (raw, False)
        written = tuple(
            sorted(
                {s["line"] for s in spans if s["line"] and s["start"] < end and s["end"] > start}
            )
        )
        html = ""
        diverges = False
        if offset >= end:
            html = _visible(body)
        else:
            cut = max(offset - start, 0)
            html = _visible(body[:cut])
            anchor = "" if marked else f' id="divergence-{side}"'
            marked = True
            diverges = True
            html += f'<mark class="div"{anchor}>{_visible(body[cut:])}'
            html += '<span class="nl">↵</span></mark>' if newline else "</mark>"
            newline = False
        if newline:
            html += '<span class="nl">↵</span>'
        rows.append(RenderLine(number, written, mark_safe(html), diverges))  # noqa: S308
        start = end
        number += 1
    if not marked:
        # `before` ends where `after` goes on: the divergence is right after its last byte.
        last = rows[-1]
        anchor = f'<mark class="div end" id="divergence-{side}">∎</mark>'
        rows[-1] = RenderLine(last.number, last.template_lines, mark_safe(last.html + anchor), True)  # noqa: S308
    return rows


def _render(
    version: TemplateVersion, special_tokens: dict[str, str], location: PairLocation
) -> dict[str, Any]:
    """Render the pair in the engine's sandbox: the template came from a stranger."""
    source = TemplateSource(
        {location.variant.template_name: version.text},
        dict(special_tokens),
        origin="chat_template.jinja",
        sha256=version.sha256,
    )
    pair = PairRequest(
        template_name=location.variant.template_name,
        kwargs=tuple(location.variant.kwargs.items()),
        session=location.session.session,
        arguments_form=location.session.arguments_form,
        index=location.pair.index,
    )
    try:
        return render_pair(
            source, pair, pool=_pool(), cpu_seconds=RENDER_SECONDS, wall_seconds=4 * RENDER_SECONDS
        )
    except SandboxError as exc:  # a limit broken: the page says which, the server goes on
        raise PairUnavailable(str(exc)) from exc


def pair_diff(
    version: TemplateVersion,
    special_tokens: dict[str, str],
    location: PairLocation,
    engine_version: str,
) -> PairDiff:
    """The diff of one pair; renders come from the cache when this pair was shown before."""
    # The special tokens are part of the key: renders kept for one model's tokens were shown
    # on another model's page (`?model=`).
    tokens = json.dumps(sorted(special_tokens.items()))
    parts = (version.sha256, engine_version, tokens, *map(str, location.url_args))
    key = "pair:" + hashlib.sha256("\0".join(parts).encode()).hexdigest()
    data = cache.get(key)
    if data is None:
        data = _render(version, special_tokens, location)
        cache.set(key, data, CACHE_SECONDS)
    before, after = data["before"], data["after"]
    divergence = location.pair.divergence
    if divergence is not None and byte_length(before) == location.pair.prefix_bytes:
        offset = divergence.char_offset
    else:
        # Rendered with other special tokens than the check's (another model's, by `?model=`),
        # the check's offset falls elsewhere (14 characters early, in the previous message, for
        # a longer bos token): the mark goes where these two renders part.
        offset = common_prefix(before, after)
    return PairDiff(
        before=before,
        after=after,
        offset=offset,
        before_lines=_lines(before, data["before_spans"], offset, "before"),
        after_lines=_lines(after, data["after_spans"], offset, "after"),
        messages=data["messages"],
        reply=data["reply"],
    )
