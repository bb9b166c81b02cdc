"""Typed, frozen results of a check; each converts to and from JSON (Django stores it)."""

from __future__ import annotations

import dataclasses
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, Union

from checks.options import ENGINE_VERSION
from checks.sources import TemplateSource

JSONValue = Any
R = TypeVar("R", bound="Record")

# Verdicts, per template and per variant.
SAFE = "safe"
UNSAFE = "unsafe"
SAFE_WHERE_RENDERABLE = "safe_where_renderable"
ERROR = "error"
VERDICTS = (SAFE, UNSAFE, SAFE_WHERE_RENDERABLE, ERROR)
#: The words the site, the API docs and the CLI use for each verdict.
VERDICT_LABELS = {
    SAFE: "Cache-safe",
    UNSAFE: "Breaks the cache",
    SAFE_WHERE_RENDERABLE: "Safe where it renders",
    ERROR: "Does not render",
}

# Causes of a failing request pair (docs/engine.md), plus the token-only seam.
HISTORY = "history"
GENERATION_PROMPT = "generation_prompt"
ASSISTANT_OUTPUT = "assistant_output"
TOKEN_SEAM = "token_seam"
CAUSES = (HISTORY, GENERATION_PROMPT, ASSISTANT_OUTPUT, TOKEN_SEAM)


Convert = Callable[[Any], Any]


def _converter(hint: Any) -> Convert | None:
    """How to rebuild a value of type `hint` from its JSON form (None: it is its JSON form).

    Worked out once per field and kept (`Record._plans`): reading the type hints for every
    value cost more than building the records (a corpus of reports decodes 7 MB)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _converter(options[0]) if len(options) == 1 else None
    if origin is tuple:
        (item_hint, *_) = typing.get_args(hint)
        item = _converter(item_hint)
        if item is None:
            return tuple
        return lambda value: tuple(None if v is None else item(v) for v in value)
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict
    return None


_SCALARS = (str, int, float, bool, type(None))


def _scalar(hint: Any) -> bool:
    """Is every value of type `hint` its own JSON form (to_dict copies it as it is)?"""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return all(_scalar(arg) for arg in typing.get_args(hint))
    return hint in _SCALARS


def _plain(value: Any) -> JSONValue:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


class Record:
    """Mixin for frozen dataclasses: `to_dict()` gives JSON types, `from_dict()` rebuilds."""

    # Per class: each field's name, how to rebuild it from JSON, and whether it is a scalar.
    _plans: ClassVar[dict[type, tuple[tuple[str, Convert | None, bool], ...]]] = {}

    @classmethod
    def _plan(cls) -> tuple[tuple[str, Convert | None, bool], ...]:
        plan = Record._plans.get(cls)
        if plan is None:
            hints = typing.get_type_hints(cls)
            plan = Record._plans[cls] = tuple(
                (f.name, _converter(hints[f.name]), _scalar(hints[f.name]))
                for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            )
        return plan

    def to_dict(self) -> dict[str, JSONValue]:
        return {
            name: value if scalar else _plain(value)
            for name, _, scalar in self._plan()
            for value in (getattr(self, name),)
        }

    @classmethod
    def from_dict(cls: type[R], data: dict[str, JSONValue]) -> R:
        kwargs = {}
        for name, convert, _ in cls._plan():
            if name in data:
                value = data[name]
                kwargs[name] = value if convert is None or value is None else convert(value)
        return cls(**kwargs)


@dataclass(frozen=True)
class Divergence(Record):
    """Where two renders first differ, and who wrote the differing bytes in each."""

    byte_offset: int
    char_offset: int
    token_index: int | None
    segment_before: str
    segment_after: str
    lines_before: tuple[int, ...]
    lines_after: tuple[int, ...]
    text_before: str
    text_after: str


@dataclass(frozen=True)
class RequestPair(Record):
    """Request k and request k+1 of a session: is k's render (plus the reply) a prefix of k+1's?"""

    session: str
    index: int
    status: str  # "pass", "warn" (reframed, may cost), "reply" (reply re-read) or "fail"
    cause: str | None
    detail: str
    divergence: Divergence | None
    prefix_bytes: int
    next_bytes: int
    reusable_share: float
    token_reusable_share: float | None = None
    #: Prompt reuse: request k's render is a (token) prefix of request k+1's.
    prompt_reuse: bool | None = None
    #: Reply reuse: request k plus the reply as the engine holds it is a prefix of request k+1.
    reply_reuse: bool | None = None
    #: The unit of the counts below: "tokens" with a tokenizer, else "bytes".
    unit: str = "bytes"
    prompt_units: int | None = None  # request k
    held_units: int | None = None  # request k plus the reply the engine holds
    next_units: int | None = None  # request k+1
    #: Per engine cache class (checks.reuse): units of request k+1 taken from the cache, and the
    #: least a turn must reuse to cost no more than the reply. None: needs a tokenizer (block).
    reuse: dict[str, int | None] | None = None
    needed: dict[str, int | None] | None = None


@dataclass(frozen=True)
class SessionResult(Record):
    session: str
    rendered: bool
    arguments_form: str  # "dict", "string" or "none" when the session has no tool calls
    error: str | None
    requests: int
    pairs: tuple[RequestPair, ...]


@dataclass(frozen=True)
class ClientResult(Record):
    """One client profile (checks.clients) under one setting: its verdict per engine cache class.

    `verdict` is the trimmable-cache verdict (prompt reuse); None when the profile does not apply
    (`note` says why). `sessions` is empty for the typical client: the variant's own sessions."""

    profile: str
    verdict: str | None
    note: str
    engines: dict[str, str]  # cache class -> verdict
    reuse_share: dict[str, float | None]  # cache class -> mean share of the next request reused
    reply_reused: bool | None  # every turn also reused the reply
    reply_units: float | None  # mean units of reply re-read on the turns that lose it
    unit: str
    sessions: tuple[SessionResult, ...] = ()


@dataclass(frozen=True)
class VariantResult(Record):
    """One setting of the template: which named template and which chat_template_kwargs."""

    template_name: str
    kwargs: dict[str, JSONValue]
    label: str
    verdict: str
    sessions: tuple[SessionResult, ...]
    mean_reusable_share: float | None
    #: Every client profile's result; the first is the typical client (`sessions` above).
    clients: tuple[ClientResult, ...] = ()


@dataclass(frozen=True)
class Finding(Record):
    """A pattern in the template source, and whether the renders confirmed it."""

    kind: str
    lines: tuple[int, ...]
    message: str
    status: str  # "confirmed", "not_observed" or "informational"
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class SeedShapeResult(Record):
    """One shape of the blog post's literal five-shape check."""

    shape: str
    variant: str
    status: str  # "ok", "fail" or "error"
    classification: str | None
    byte_offset: int | None
    prev_bytes: int
    full_bytes: int
    error: str | None


@dataclass(frozen=True)
class Failure(Record):
    """One flattened row per non-passing request pair, for tables and the CLI's JSON."""

    variant: str
    session: str
    request_index: int
    status: str
    cause: str
    byte_offset: int | None
    token_index: int | None
    segment: str | None  # in request k's render
    segment_next: str | None  # in request k+1's render
    template_lines: tuple[int, ...]  # lines that wrote the diverging bytes, in either render
    detail: str


@dataclass(frozen=True)
class TemplateReport(Record):
    """Everything the engine found about one chat template source."""

    file: str
    origin: str
    sha256: str
    engine_version: str
    verdict: str
    summary: str
    reason: str | None
    template_names: tuple[str, ...]
    kwargs_read: tuple[str, ...]
    variants: tuple[VariantResult, ...]
    failures: tuple[Failure, ...]
    findings: tuple[Finding, ...]
    seed_check: tuple[SeedShapeResult, ...]
    tokenizer_sha256: str | None = None
    elapsed_seconds: float = 0.0
    #: Jinja renders performed (memoized renders shared by sessions count once).
    renders: int = 0


def checked_on_bytes(summary: str, reason: str) -> str:
    """`summary` saying the check ran on bytes alone and why (no usable tokenizer.json), so
    nobody takes a bytes-only verdict for a token-level one."""
    return f"{summary} (Checked on bytes only: {reason.rstrip('.')}.)"


def error_report(
    source: TemplateSource, file: str, reason: str, started: float, tokenizer_sha: str | None
) -> TemplateReport:
    """The report of a template that could not be checked, and why (`started`: perf_counter)."""
    return TemplateReport(
        file=file,
        origin=source.origin,
        sha256=source.sha256,
        engine_version=ENGINE_VERSION,
        verdict=ERROR,
        # One sentence: a reason may end with its own period (Jinja's messages do).
        summary=f"Could not check this template: {reason.rstrip('.')}.",
        reason=reason,
        template_names=source.names,
        kwargs_read=(),
        variants=(),
        failures=(),
        findings=(),
        seed_check=(),
        tokenizer_sha256=tokenizer_sha,
        elapsed_seconds=round(time.perf_counter() - started, 4),
    )
