"""Static findings from the template AST: patterns that can break a prompt cache, with lines.

A finding is a hypothesis; `link_findings` marks it confirmed when a failing request pair's
diverging bytes were written by one of its lines (or a session raised its message).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes

from checks.reports import GENERATION_PROMPT, Finding, VariantResult
from checks.template_ast import find

# Loop attributes whose value for a message depends on how many messages follow it.
_COUNT_DEPENDENT_LOOP_ATTRS = {"last", "revindex", "revindex0", "length"}
_POSITION_LOOP_ATTRS = {"index", "index0"}
_MARKER_NAME = re.compile(r"last|latest|final", re.IGNORECASE)
_THINK_TEXT = re.compile(r"think|reasoning", re.IGNORECASE)
# Dates the caller may pass; a template falling back to a fixed default stays stable without one.
_CALLER_DATE_NAMES = {"date_string", "current_date", "today_date"}
# strftime directives finer than a day (hour, minute, second, AM/PM, locale time, epoch
# seconds), with glibc's optional flags (`%-H`): the prompt then changes between requests.
_TIME_OF_DAY = re.compile(r"%[-_0^#]*[HIklMSpPXcfTRrs]")

MOVING_MARKER = "moving_marker"
LOOP_POSITION_GATING = "loop_position_gating"
THINKING_STRIPPED = "thinking_stripped"
THINKING_INJECTED = "thinking_injected"
MOVED_TO_LATER_MESSAGE = "moved_to_later_message"
DATE_DEPENDENT = "date_dependent"
TIME_DEPENDENT = "time_dependent"
CALLER_DATE = "caller_date"
RAISES = "raise_exception"


@dataclass(frozen=True)
class _Draft:
    kind: str
    lines: tuple[int, ...]
    message: str
    scope: frozenset[int] = frozenset()

    def covers(self, lines: Iterable[int]) -> bool:
        return bool((self.scope | set(self.lines)) & set(lines))


def _names(node: nodes.Node) -> set[str]:
    """Variable names a node mentions, namespace attributes (`ns.last_index`) included."""
    every = [node, *find(node, (nodes.Name, nodes.NSRef, nodes.Getattr))]
    found = {n.name for n in every if isinstance(n, nodes.Name)}
    found |= {n.attr for n in every if isinstance(n, nodes.NSRef | nodes.Getattr)}
    return found


def _extent(node: nodes.Node) -> frozenset[int]:
    """The template lines a statement spans, its body included."""
    linenos = [n.lineno for n in (node, *find(node, nodes.Node)) if n.lineno is not None]
    return frozenset(range(min(linenos), max(linenos) + 1))


def _enclosing_ifs(ast: nodes.Template, inner: nodes.Node) -> frozenset[int]:
    scope: set[int] = set()
    for condition in find(ast, nodes.If):
        if any(n is inner for n in find(condition.test, type(inner))) or condition.test is inner:
            scope |= _extent(condition)
    return frozenset(scope)


def _loop_attrs(node: nodes.Node) -> Iterator[nodes.Getattr]:
    for getattr_node in find(node, nodes.Getattr):
        target = getattr_node.node
        if isinstance(target, nodes.Name) and target.name == "loop":
            yield getattr_node


def _is_messages_loop(node: nodes.For) -> bool:
    """A loop over the conversation: `messages`, or a list derived from it (`loop_messages`)."""
    return any("messages" in name for name in _names(node.iter))


def _assigned_names(node: nodes.Node) -> Iterator[tuple[str, nodes.Node]]:
    """Names set by `{% set %}`, `{% set ns.x %}` or as `namespace(x=...)` keywords."""
    for call in find(node, nodes.Call):
        if isinstance(call.node, nodes.Name) and call.node.name == "namespace":
            for keyword in call.kwargs:
                yield keyword.key, keyword
    for assign in find(node, nodes.Assign):
        target = assign.target
        if isinstance(target, nodes.Name):
            yield target.name, assign
        elif isinstance(target, nodes.NSRef):
            yield target.attr, assign


def _moving_markers(ast: nodes.Template) -> list[_Draft]:
    markers: dict[str, list[int]] = {}
    for name, assign in _assigned_names(ast):
        if _MARKER_NAME.search(name) and re.search(r"index|idx|query|user|pos", name, re.I):
            markers.setdefault(name, []).append(assign.lineno)
    drafts = []
    for name, lines in markers.items():
        compares = [n for n in find(ast, nodes.Compare) if name in _names(n)]
        scope: frozenset[int] = frozenset()
        for compare in compares:
            scope |= _enclosing_ifs(ast, compare)
        drafts.append(
            _Draft(
                MOVING_MARKER,
                tuple(sorted({n.lineno for n in compares} | set(lines))),
                f"'{name}' marks a position counted from the end of the conversation; "
                "a message compared against it can render differently once a turn is added",
                scope,
            )
        )
    return drafts


def _own_conditions(loop: nodes.For) -> list[Any]:
    """If/CondExpr nodes whose `loop` is this loop's: not inside a nested for loop."""
    nested: set[int] = set()
    for inner in find(loop, nodes.For):
        for child in [*inner.body, *inner.else_]:
            nested |= {id(child), *(id(n) for n in find(child, nodes.Node))}
    conditions: list[Any] = [*find(loop, nodes.If), *find(loop, nodes.CondExpr)]
    return [c for c in conditions if id(c) not in nested]


def _last_element(test: nodes.Node) -> bool:
    """Does a test single out the last element of a list (`xs[-1]`, `xs | last`)?"""
    for item in [test, *find(test, nodes.Getitem)]:
        if isinstance(item, nodes.Getitem):
            index = item.arg
            if isinstance(index, nodes.Neg) or (
                isinstance(index, nodes.Const) and isinstance(index.value, int) and index.value < 0
            ):
                return True
    return any(
        f.name == "last" for f in [test, *find(test, nodes.Filter)] if isinstance(f, nodes.Filter)
    )


def _loop_gating(ast: nodes.Template) -> list[_Draft]:
    drafts = []
    for loop in find(ast, nodes.For):
        if not _is_messages_loop(loop):
            continue
        lines: set[int] = set()
        used: set[str] = set()
        scope: set[int] = set()
        for condition in _own_conditions(loop):
            before = len(lines)
            for attr in _loop_attrs(condition.test):
                if (
                    attr.attr in _COUNT_DEPENDENT_LOOP_ATTRS
                    or attr.attr in _POSITION_LOOP_ATTRS
                    and any(
                        "length" in {f.name for f in find(c, nodes.Filter)}
                        or any(_MARKER_NAME.search(n) for n in _names(c))
                        for c in find(condition.test, nodes.Compare)
                    )
                ):
                    lines.add(attr.lineno)
                    used.add(attr.attr)
            if len(lines) > before:
                scope |= _extent(condition)
        if lines:
            attrs = ", ".join(f"loop.{name}" for name in sorted(used))
            drafts.append(
                _Draft(
                    LOOP_POSITION_GATING,
                    tuple(sorted(lines)),
                    f"{attrs} gates output inside the messages loop (line {loop.lineno}): "
                    "a message's bytes can depend on how many messages follow it",
                    frozenset(scope),
                )
            )
    return drafts


def _consts(node: nodes.Node) -> Iterable[str]:
    for const in [node, *find(node, nodes.Const)]:
        if not isinstance(const, nodes.Const):
            continue
        if isinstance(const.value, str):
            yield const.value


def _thinking(ast: nodes.Template) -> list[_Draft]:
    stripped: set[int] = set()
    for call in find(ast, nodes.Call):
        callee = call.node
        method = callee.attr if isinstance(callee, nodes.Getattr) else None
        if method in {"split", "replace", "strip", "rstrip", "lstrip"} and any(
            _THINK_TEXT.search(value) for arg in call.args for value in _consts(arg)
        ):
            stripped.add(call.lineno)
    injected: set[int] = set()
    injected_scope: set[int] = set()
    for condition in find(ast, nodes.If):
        test_names = _names(condition.test)
        if not ({"enable_thinking", "add_generation_prompt"} & test_names):
            continue
        for output in find(condition, nodes.Output):
            for child in output.nodes:
                texts = [child.data] if isinstance(child, nodes.TemplateData) else _consts(child)
                if any("<think" in text or "</think" in text for text in texts):
                    injected.add(child.lineno)
                    injected_scope |= _extent(condition)
    drafts = []
    if stripped:
        drafts.append(
            _Draft(
                THINKING_STRIPPED,
                tuple(sorted(stripped)),
                "reasoning is cut out of assistant content (split/strip on a think tag): "
                "earlier turns can lose the reasoning the model emitted",
                frozenset(stripped),
            )
        )
    if injected:
        drafts.append(
            _Draft(
                THINKING_INJECTED,
                tuple(sorted(injected)),
                "a think tag is written depending on enable_thinking or the generation prompt: "
                "the generation prompt may not match the turn once it is history",
                frozenset(injected_scope),
            )
        )
    return drafts


def _moved_blocks(ast: nodes.Template) -> list[_Draft]:
    drafts = []
    for loop in find(ast, nodes.For):
        if not _is_messages_loop(loop):
            continue
        for condition in _own_conditions(loop):
            if not isinstance(condition, nodes.If):
                continue
            gated = {a.attr for a in _loop_attrs(condition.test)} & _COUNT_DEPENDENT_LOOP_ATTRS
            marker = any(_MARKER_NAME.search(n) for n in _names(condition.test))
            if not (gated or marker or _last_element(condition.test)):
                continue
            body_names: set[str] = set()
            for child in condition.body:
                body_names |= _names(child)
            moved = sorted(
                name for name in body_names if name == "tools" or "system" in name.lower()
            )
            if moved:
                drafts.append(
                    _Draft(
                        MOVED_TO_LATER_MESSAGE,
                        (condition.lineno,),
                        f"{', '.join(moved)} rendered next to the last message (line "
                        f"{condition.lineno}): it moves every time a turn is added",
                        _extent(condition),
                    )
                )
    return drafts


def reads_clock(ast: nodes.Template) -> bool:
    """Does the template call (or otherwise reach) strftime_now?"""
    return any(n.name == "strftime_now" for n in find(ast, nodes.Name))


def _clock_formats(ast: nodes.Template) -> tuple[dict[int, str], set[int]]:
    """strftime_now formats finer than a day, by line; and the lines of every other use."""
    timed: dict[int, str] = {}
    other: set[int] = set()
    called: set[int] = set()
    for call in find(ast, nodes.Call):
        if not (isinstance(call.node, nodes.Name) and call.node.name == "strftime_now"):
            continue
        called.add(id(call.node))
        fmt = call.args[0] if call.args else None
        if isinstance(fmt, nodes.Const) and isinstance(fmt.value, str):
            if _TIME_OF_DAY.search(fmt.value):
                timed.setdefault(call.lineno, fmt.value)
            else:
                other.add(call.lineno)
        else:
            # A format chosen at render time may hold a time: the dynamic check decides.
            other.add(call.lineno)
    for name in find(ast, nodes.Name):
        if name.name == "strftime_now" and id(name) not in called:
            other.add(name.lineno)
    return timed, other - set(timed)


def _dates(ast: nodes.Template) -> list[_Draft]:
    drafts = []
    timed, clock = _clock_formats(ast)
    if timed:
        formats = ", ".join(repr(f) for f in dict.fromkeys(timed.values()))
        drafts.append(
            _Draft(
                TIME_DEPENDENT,
                tuple(sorted(timed)),
                f"strftime_now writes the time of day ({formats}) into the prompt: it changes "
                "between requests, so the cached prefix stops matching there on every request",
            )
        )
    if clock:
        drafts.append(
            _Draft(
                DATE_DEPENDENT,
                tuple(sorted(clock)),
                "strftime_now writes today's date into the prompt: the cached prefix stops "
                "matching when the date changes",
            )
        )
    passed = sorted({n.lineno for n in find(ast, nodes.Name) if n.name in _CALLER_DATE_NAMES})
    if passed:
        drafts.append(
            _Draft(
                CALLER_DATE,
                tuple(passed),
                "the prompt includes a date the caller may pass: keep it fixed within a session",
            )
        )
    return drafts


# What a raise_exception message constrains, by the words it uses (first match wins).
_CONSTRAINTS = (
    ("altern", "role alternation"),
    ("system", "system message"),
    (" id", "tool-call id format"),
    ("tool", "tool calls"),
    ("argument", "tool-call arguments"),
    ("role", "roles"),
)


def _raises(ast: nodes.Template) -> list[_Draft]:
    drafts = []
    for call in find(ast, nodes.Call):
        if isinstance(call.node, nodes.Name) and call.node.name == "raise_exception":
            text = " ".join(value for arg in call.args for value in _consts(arg)).strip()
            lowered = text.lower()
            constraint = next((c for word, c in _CONSTRAINTS if word in lowered), "input")
            message = f"{text} [constraint: {constraint}]" if text else "raises on some input"
            drafts.append(_Draft(RAISES, (call.lineno,), message))
    return drafts


def static_findings(ast: nodes.Template) -> list[_Draft]:
    """All static patterns in a parsed template, in source order."""
    drafts = [
        *_moving_markers(ast),
        *_loop_gating(ast),
        *_thinking(ast),
        *_moved_blocks(ast),
        *_dates(ast),
        *_raises(ast),
    ]
    return sorted(drafts, key=lambda d: (d.lines[:1], d.kind))


def parse(environment: jinja2.Environment, text: str) -> nodes.Template:
    return environment.parse(text)


def link_findings(drafts: list[_Draft], variants: tuple[VariantResult, ...]) -> tuple[Finding, ...]:
    """Confirm each finding from the dynamic results, or mark it not observed."""
    findings = []
    for draft in drafts:
        evidence: list[str] = []
        for variant in variants:
            # Every client profile's renders count: reasoning shows only where a client sends it.
            sessions = [*variant.sessions, *(s for c in variant.clients for s in c.sessions)]
            for session in sessions:
                if draft.kind == RAISES:
                    if session.error and draft.message and draft.message[:40] in session.error:
                        evidence.append(f"{variant.label}: {session.session} raises")
                    continue
                for pair in session.pairs:
                    div = pair.divergence
                    if pair.status == "pass" or div is None or pair.detail.startswith("the client"):
                        continue
                    # Dropped reasoning shows where content is written, not where it was split.
                    by_cause = (
                        (draft.kind == THINKING_STRIPPED and "reasoning" in pair.detail)
                        or (draft.kind == THINKING_INJECTED and pair.cause == GENERATION_PROMPT)
                        # The time may be set on one line and written on another.
                        or (draft.kind == TIME_DEPENDENT and "strftime_now" in pair.detail)
                    )
                    if by_cause or draft.covers(div.lines_before + div.lines_after):
                        evidence.append(f"{variant.label}: {session.session} pair {pair.index}")
        if draft.kind in (DATE_DEPENDENT, CALLER_DATE):
            status = "informational"
        else:
            status = "confirmed" if evidence else "not_observed"
        findings.append(
            Finding(draft.kind, draft.lines, draft.message, status, tuple(dict.fromkeys(evidence)))
        )
    return tuple(findings)
