"""CacheSafe's check engine: does a chat template keep a prompt cache warm across an agent's turns?

A library with no Django imports. `check_template` checks one source in the sandbox pool,
`check_templates` checks many in parallel; both return `TemplateReport`s and use a result cache.
"""

from __future__ import annotations

import hashlib
import importlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.options import ENGINE_VERSION, CheckOptions
from checks.reports import TemplateReport, checked_on_bytes, error_report
from checks.results_cache import (
    DirectoryResultCache,
    MemoryResultCache,
    ResultCache,
    cache_key,
)
from checks.sandbox import SandboxError, SandboxLimits, SandboxPool, default_pool
from checks.sources import (
    SourceError,
    TemplateSource,
    load_repository,
    load_source,
    sha256_text,
)

if TYPE_CHECKING:
    from checks.diagnose import ClientRequest, RequestError, parse_text, read_requests
    from checks.pairs import PairRequest, PairUnavailable

# Imported on first use: the engine, Jinja and the diagnosis cost a tenth of a second, and the
# CLI pays it before it can start its sandbox workers, which pay it again. The parent of a
# sandbox pool never renders a template.
_LAZY = {
    "ClientRequest": "checks.diagnose",
    "RequestError": "checks.diagnose",
    "parse_text": "checks.diagnose",
    "read_requests": "checks.diagnose",
    "PairRequest": "checks.pairs",
    "PairUnavailable": "checks.pairs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'checks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ENGINE_VERSION",
    "CheckInput",
    "CheckOptions",
    "ClientRequest",
    "DirectoryResultCache",
    "MemoryResultCache",
    "PairRequest",
    "PairUnavailable",
    "RequestError",
    "ResultCache",
    "SandboxLimits",
    "SandboxPool",
    "SourceError",
    "TemplateReport",
    "TemplateSource",
    "check_template",
    "check_templates",
    "diagnose_requests",
    "parse_text",
    "read_requests",
    "render_pair",
    "default_cache",
]

_default_cache = MemoryResultCache()


def default_cache() -> MemoryResultCache:
    return _default_cache


@dataclass(frozen=True)
class CheckInput:
    """One thing to check: a parsed source (or why it could not be parsed) and a tokenizer."""

    source: TemplateSource | None
    file: str = ""
    tokenizer_json: str | None = None
    source_error: str | None = None
    source_sha256: str = ""
    #: Why the repository's own tokenizer.json was not used (the check runs on bytes only).
    tokenizer_note: str = ""


def as_input(
    source: TemplateSource | str | Path, file: str | None, tokenizer_json: str | None
) -> CheckInput:
    """Accept a TemplateSource, template text, or a path (`.jinja`, a JSON config, a repository)."""
    if isinstance(source, TemplateSource):
        return CheckInput(source, file or source.origin, tokenizer_json)
    if isinstance(source, Path):
        try:
            loaded = load_repository(source) if source.is_dir() else load_source(source)
        except SourceError as exc:
            sha = sha256_bytes(source)
            return CheckInput(None, file or source.name, tokenizer_json, str(exc), sha)
        return CheckInput(loaded, file or source.name, tokenizer_json)
    return CheckInput(TemplateSource({"default": source}), file or "template", tokenizer_json)


def sha256_bytes(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _source_error_report(item: CheckInput) -> TemplateReport:
    placeholder = TemplateSource({"default": ""}, origin=item.file, sha256=item.source_sha256)
    reason = item.source_error or "unreadable input"
    return error_report(placeholder, item.file, reason, time.perf_counter(), None)


def _source_fields(source: TemplateSource) -> dict[str, Any]:
    """What every sandbox job carries of its template source (the worker rebuilds it)."""
    return {
        "templates": source.templates,
        "special_tokens": source.special_tokens,
        "origin": source.origin,
        "sha256": source.sha256,
    }


def sandbox_job(
    source: TemplateSource, file: str, options: CheckOptions, tokenizer_json: str | None
) -> dict[str, Any]:
    """The JSON job a sandbox worker runs for one template check."""
    return {
        **_source_fields(source),
        "file": file,
        "options": options.to_dict(),
        "tokenizer_json": tokenizer_json,
        "tokenizer_sha256": None if tokenizer_json is None else sha256_text(tokenizer_json),
    }


def _run(
    item: CheckInput,
    options: CheckOptions,
    pool: SandboxPool,
    cache: ResultCache | None,
    cpu_seconds: float | None,
) -> TemplateReport:
    if item.source is None:
        return _source_error_report(item)
    report = _checked(item, options, pool, cache, cpu_seconds)
    source = item.source
    # Said wherever the tokens can matter: every verdict, and errors of templates that use them.
    if source.placeholder_tokens and (
        report.verdict != "error"
        or any(n in t for n in source.placeholder_tokens for t in source.templates.values())
    ):
        report = replace(report, summary=f"{report.summary} {_placeholder_note(item.source)}")
    if item.tokenizer_note and report.verdict != "error":
        report = replace(report, summary=checked_on_bytes(report.summary, item.tokenizer_note))
    return report


def _placeholder_note(source: TemplateSource) -> str:
    names = " and ".join(source.placeholder_tokens)
    values = ", ".join(source.special_tokens[name] for name in source.placeholder_tokens)
    return (
        f"(Rendered with placeholder {names} ({values}): no tokenizer_config.json beside the"
        " file; give the model's own for its real tokens.)"
    )


def _checked(
    item: CheckInput,
    options: CheckOptions,
    pool: SandboxPool,
    cache: ResultCache | None,
    cpu_seconds: float | None,
) -> TemplateReport:
    assert item.source is not None
    source = item.source
    tokenizer_sha = sha256_text(item.tokenizer_json) if item.tokenizer_json is not None else None
    key = cache_key(
        source.sha256, tokenizer_sha, ENGINE_VERSION, source.special_tokens, options.to_dict()
    )
    if cache is not None:
        cached = cache.get(key)
        if cached is not None:
            try:
                return TemplateReport.from_dict({**cached, "file": item.file})
            except (TypeError, KeyError, ValueError, AttributeError):
                pass  # not a report (a file edited or cut short): checked again
    job = sandbox_job(source, item.file, options, item.tokenizer_json)
    started = time.perf_counter()
    try:
        answer = pool.run(job, cpu_seconds)
    except SandboxError as exc:
        # Not cached: a timeout can be the machine's fault as much as the template's.
        return error_report(source, item.file, str(exc), started, tokenizer_sha)
    report = TemplateReport.from_dict(answer["report"])
    if cache is not None:
        cache.put(key, answer["report"])
    return report


def check_template(
    source: TemplateSource | str | Path,
    *,
    file: str | None = None,
    tokenizer_json: str | None = None,
    options: CheckOptions | None = None,
    pool: SandboxPool | None = None,
    cache: ResultCache | None = _default_cache,
    cpu_seconds: float | None = None,
) -> TemplateReport:
    """Check one template source in the sandbox; never raises for a hostile or broken template."""
    item = as_input(source, file, tokenizer_json)
    return _run(item, options or CheckOptions(), pool or default_pool(), cache, cpu_seconds)


def check_templates(
    items: Iterable[CheckInput | TemplateSource | Path],
    *,
    options: CheckOptions | None = None,
    pool: SandboxPool | None = None,
    cache: ResultCache | None = _default_cache,
    cpu_seconds: float | None = None,
    on_report: Callable[[int, TemplateReport], Any] | None = None,
) -> list[TemplateReport]:
    """Check many sources across the pool in parallel; results keep the input order.

    `on_report(index, report)` is called as each report is ready, in the thread that waited for
    it, while other checks still run (the CLI writes each report's JSON there)."""
    pool = pool or default_pool()
    options = options or CheckOptions()
    inputs: Sequence[CheckInput] = [
        item if isinstance(item, CheckInput) else as_input(item, None, None) for item in items
    ]
    from concurrent.futures import ThreadPoolExecutor  # with logging: 8 ms a sandbox worker

    # Longest first (by template text, which tracks the check's time): the last jobs to start
    # are short, so the workers finish together instead of one waiting on a big template.
    order = sorted(range(len(inputs)), key=lambda i: -_size(inputs[i]))
    reports: list[TemplateReport | None] = [None] * len(inputs)

    def run(i: int) -> TemplateReport:
        report = _run(inputs[i], options, pool, cache, cpu_seconds)
        if on_report is not None:
            on_report(i, report)
        return report

    with ThreadPoolExecutor(max_workers=pool.size) as executor:
        futures = {executor.submit(run, i): i for i in order}
        try:
            for future, i in futures.items():
                reports[i] = future.result()
        except KeyboardInterrupt:
            # Ctrl-C: the jobs not started are dropped and the workers stopped, so that the
            # threads waiting on them return now, not once their render's CPU budget is spent.
            for future in futures:
                future.cancel()
            pool.close()
            raise
    return [report for report in reports if report is not None]


def _size(item: CheckInput) -> int:
    return sum(map(len, item.source.templates.values())) if item.source is not None else 0


def diagnose_requests(
    source: TemplateSource,
    requests: Sequence[ClientRequest],
    *,
    pool: SandboxPool | None = None,
    tokenizer_json: str | None = None,
    cpu_seconds: float | None = None,
    wall_seconds: float | None = None,
) -> list[dict[str, Any]]:
    """Why each request of a client's conversation did or did not keep the cache (docs/
    diagnose.md): one dict per pair, rendered in the sandbox. The CPU budget grows with the
    number of requests (each is rendered once).

    Raises SandboxError when the template breaks a limit.
    """
    pool = pool or default_pool()
    budget = cpu_seconds or pool.limits.cpu_seconds
    budget *= max(1.0, len(requests) / 20)
    job = {
        "kind": "diagnose",
        **_source_fields(source),
        "requests": [r.to_dict() for r in requests],
        "tokenizer_json": tokenizer_json,
        "tokenizer_sha256": None if tokenizer_json is None else sha256_text(tokenizer_json),
    }
    answer = pool.run(job, budget, wall_seconds=wall_seconds)
    pairs: list[dict[str, Any]] = answer["pairs"]
    return pairs


def render_pair(
    source: TemplateSource,
    pair: PairRequest,
    *,
    pool: SandboxPool | None = None,
    cpu_seconds: float | None = None,
    wall_seconds: float | None = None,
) -> dict[str, Any]:
    """Both renders of one request pair, whole, with spans, rendered in the sandbox (a page
    waits for it: `wall_seconds` bounds the wait).

    Raises PairUnavailable when the template does not render the pair, SandboxError when it
    breaks a limit (time, memory, output).
    """
    job = {
        "kind": "render_pair",
        **_source_fields(source),
        "pair": pair.to_dict(),
    }
    answer = (pool or default_pool()).run(job, cpu_seconds, wall_seconds=wall_seconds)
    if "unavailable" in answer:
        from checks.pairs import PairUnavailable

        raise PairUnavailable(str(answer["unavailable"]))
    result: dict[str, Any] = answer["pair"]
    return result
