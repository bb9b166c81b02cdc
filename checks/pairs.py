"""Render one request pair of a check again, in full, with who wrote every character.

The report keeps a short excerpt around each divergence; a diff page needs both renders whole.
This runs in a sandbox worker (job kind `render_pair`), like a check: the template is hostile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jinja2

from checks.attribution import Span
from checks.clients import TYPICAL, profile_named
from checks.conversations import TOOLS, session_named
from checks.engine import (
    Renderer,
    RenderFailed,
    learn,
    reasoning_mode,
    sent_messages,
)
from checks.options import CheckOptions
from checks.rendering import TemplateCache
from checks.sources import TemplateSource
from checks.variants import Variant


class PairUnavailable(ValueError):
    """The template does not render this pair (or the pair does not exist)."""


@dataclass(frozen=True)
class PairRequest:
    """Which pair: the variant (template name and kwargs), the session and its argument form,
    and `index`, the later request of the pair (1 = requests 0 and 1)."""

    template_name: str
    kwargs: tuple[tuple[str, Any], ...]
    session: str
    arguments_form: str
    index: int
    client: str = TYPICAL.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "template_name": self.template_name,
            "kwargs": [list(item) for item in self.kwargs],
            "session": self.session,
            "arguments_form": self.arguments_form,
            "index": self.index,
            "client": self.client,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PairRequest:
        return cls(
            str(data["template_name"]),
            tuple((str(k), v) for k, v in data["kwargs"]),
            str(data["session"]),
            str(data["arguments_form"]),
            int(data["index"]),
            str(data.get("client", TYPICAL.name)),
        )


def _plain(spans: list[Span]) -> list[dict[str, int]]:
    return [{"start": s.start, "end": s.end, "line": s.line} for s in spans]


def render_pair(
    source: TemplateSource, pair: PairRequest, templates: TemplateCache
) -> dict[str, Any]:
    """Both renders of the pair, their spans, the later request's messages and the reply:
    rendered as the check rendered them (the reasoning mode of the setting, the client's
    history, the clock moving between requests)."""
    renderer = Renderer(source, templates, CheckOptions())
    variant = Variant(pair.template_name, pair.kwargs)
    try:
        session = session_named(pair.session)
    except KeyError as exc:
        raise PairUnavailable(f"no session named {pair.session!r}") from exc
    try:
        client = profile_named(pair.client)
    except KeyError as exc:
        raise PairUnavailable(f"no client profile named {pair.client!r}") from exc
    try:
        learn(renderer, {name: renderer.parsed(name) for name in source.templates})
    except jinja2.TemplateSyntaxError as exc:
        raise PairUnavailable(f"template syntax error at line {exc.lineno}") from exc
    ends = session.request_ends()
    if not 0 < pair.index < len(ends):
        raise PairUnavailable(f"request {pair.index} is not part of session {session.name}")
    try:
        mode = reasoning_mode(renderer, variant)
    except RenderFailed as exc:
        raise PairUnavailable(str(exc)) from exc
    truth, messages = sent_messages(session, mode, client, pair.arguments_form)
    request, next_request = messages[: ends[pair.index - 1]], messages[: ends[pair.index]]
    tools = TOOLS if session.uses_tools else None
    tick = pair.index - 1
    try:
        before = renderer.render(variant, request, tools, True, tick)
        after = renderer.render(variant, next_request, tools, True, tick + 1)
    except RenderFailed as exc:
        raise PairUnavailable(str(exc)) from exc
    return {
        "before": before,
        "after": after,
        # Every character attributed: the page shows who wrote each line, not just the first.
        "before_spans": _plain(renderer.spans(variant, request, tools, len(before), tick)),
        "after_spans": _plain(renderer.spans(variant, next_request, tools, len(after), tick + 1)),
        "messages": [dict(m) for m in next_request],
        "reply": dict(truth[ends[pair.index - 1]]),
    }
