"""Which template line wrote which bytes, and for which message: render with instrumentation.

Each chunk `Template.generate()` yields comes from one `yield` in the compiled module. Following the
generator chain (`gi_yieldfrom`) to the innermost frame gives the Python line, which the template's
debug info maps back to a template line. That frame's locals hold the loop variables: a value that
*is* one of the message or tool dicts passed in names the segment.
"""

from __future__ import annotations

import bisect
import re
import weakref
from dataclasses import dataclass
from typing import Any

import jinja2

from checks.rendering import RenderLimitError

#: What Jinja counts as a line break (its lexer's `newline_re`), so line N here is its line N.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def template_lines(text: str) -> list[str]:
    """The lines of a template as Jinja numbers them: a lone carriage return breaks a line, a
    form feed or U+2028 does not (`str.splitlines` breaks on both, a split on line feeds on
    neither). Pages that number a template's lines use this, so a culprit line is the
    engine's."""
    return _LINE_BREAK.split(text)


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    line: int
    segment: str


def _innermost_frame(generator: Any) -> Any:
    while getattr(generator, "gi_yieldfrom", None) is not None:
        generator = generator.gi_yieldfrom
    return getattr(generator, "gi_frame", None)


def message_labels(messages: list[dict[str, Any]]) -> list[str]:
    """'system', 'user 1', 'assistant 2', 'tool 1', … numbered per role from 1."""
    counts: dict[str, int] = {}
    labels = []
    for message in messages:
        role = str(message.get("role", "message"))
        if role == "system" and "system" not in counts:
            counts["system"] = 1
            labels.append("system")
            continue
        counts[role] = counts.get(role, 0) + 1
        labels.append(f"{role} {counts[role]}")
    return labels


# "tools" as a word (AVAILABLE_TOOLS, <tools>, # Tools), not "tool_call" or "tool_calls".
_TOOLS_WORD = re.compile(r"tools(?![a-z_])", re.IGNORECASE)


class _Identities:
    def __init__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None):
        labels = message_labels(messages)
        self.by_id: dict[int, str] = {}
        for message, label in zip(messages, labels, strict=True):
            self.by_id[id(message)] = label
            content = message.get("content")
            # Long strings only: short ones may be interned and shared with unrelated values.
            if isinstance(content, str) and len(content) > 8:
                self.by_id.setdefault(id(content), label)
            for call in message.get("tool_calls") or ():
                if isinstance(call, dict):
                    self.by_id[id(call)] = label
        self.tool_ids = {id(tool) for tool in tools or ()}
        self.tool_ids |= {
            id(tool.get("function")) for tool in tools or () if isinstance(tool, dict)
        }
        self.tool_names = [
            str(tool.get("function", {}).get("description", ""))
            for tool in tools or ()
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
        ]
        self.keep_alive = (messages, tools)

    def segment(self, frame: Any, chunk: str) -> str | None:
        # Called for every chunk of an attributed render: the lookups run in C (map, filter).
        ids = list(map(id, frame.f_locals.values())) if frame is not None else []
        # A tools block is often written inside a message's iteration (Mistral puts it in the
        # last user turn): a tool in scope, or a chunk naming the tool list, wins over the message.
        if self.tool_ids:
            if not self.tool_ids.isdisjoint(ids):
                return "tools"
            if _TOOLS_WORD.search(chunk) or any(name and name in chunk for name in self.tool_names):
                return "tools"
        # Innermost loop variables come last in the compiled code's locals; prefer them.
        label: str | None = next(filter(None, map(self.by_id.get, reversed(ids))), None)
        return label


class _LineMap:
    """`Template.get_corresponding_lineno`, without re-parsing the debug info on every call
    (`Template.debug_info` parses it on every read: one map per template, see `line_map`)."""

    def __init__(self, template: jinja2.Template) -> None:
        # Jinja writes the mapping in code-line order; among equal code lines the last one wins,
        # as in Jinja's own reversed scan, which bisect_right reproduces.
        pairs = template.debug_info
        self._code_lines = [code for _, code in pairs]
        self._source_lines = [source for source, _ in pairs]

    def template_line(self, code_line: int) -> int:
        index = bisect.bisect_right(self._code_lines, code_line) - 1
        return self._source_lines[index] if index >= 0 else 1


_LINE_MAPS: weakref.WeakKeyDictionary[jinja2.Template, _LineMap] = weakref.WeakKeyDictionary()


def line_map(template: jinja2.Template) -> _LineMap:
    lines = _LINE_MAPS.get(template)
    if lines is None:
        lines = _LINE_MAPS[template] = _LineMap(template)
    return lines


def render_with_spans(
    template: jinja2.Template,
    context: dict[str, Any],
    max_chars: int,
    until: int | None = None,
) -> tuple[str, list[Span]]:
    """Render like `rendering.render`, returning the text and a span per yielded chunk.

    With `until`, stop once the chunk holding that character offset has been attributed.
    """
    messages = context["messages"]
    identities = _Identities(messages, context.get("tools"))
    lines = line_map(template)
    generator = template.generate(context)
    spans: list[Span] = []
    parts: list[str] = []
    position = 0
    last_segment = "preamble"
    seen_message = False
    for chunk in generator:
        if not chunk:
            continue
        frame = _innermost_frame(generator)
        line = 0
        if frame is not None and frame.f_code.co_filename == "<template>":
            line = lines.template_line(frame.f_lineno)
        segment = identities.segment(frame, chunk)
        if segment is None:
            segment = last_segment if seen_message else "preamble"
        else:
            seen_message = seen_message or segment != "tools"
        spans.append(Span(position, position + len(chunk), line, segment))
        last_segment = segment
        parts.append(chunk)
        position += len(chunk)
        if position > max_chars:
            raise RenderLimitError(f"output over {max_chars // (1024 * 1024)} MiB")
        if until is not None and position >= until:
            generator.close()  # type: ignore[attr-defined]
            break
    return "".join(parts), spans


def span_at(spans: list[Span], offset: int) -> Span | None:
    """The span holding character `offset` (or the last span when offset is the end)."""
    if not spans:
        return None
    starts = [span.start for span in spans]
    index = bisect.bisect_right(starts, offset) - 1
    return spans[max(0, min(index, len(spans) - 1))]
