"""Re-checking an unchanged template costs nothing; anything that can change a result misses."""

from __future__ import annotations

from pathlib import Path

import pytest

import checks
from checks import (
    CheckOptions,
    DirectoryResultCache,
    MemoryResultCache,
    SandboxLimits,
    SandboxPool,
    check_template,
    sandbox_job,
)
from checks.engine import run_check
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import ERROR, SAFE, UNSAFE, TemplateReport
from checks.sources import TemplateSource
from tests.checks.conftest import CHATML

MARKER = (
    "{% for m in messages %}{% if loop.last %}[LAST]{% endif %}{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}>{% endif %}"
)


def test_recheck_is_served_from_the_cache_without_the_sandbox() -> None:
    cache = MemoryResultCache()
    pool = SandboxPool(size=1)
    first = check_template(CHATML, file="a.jinja", pool=pool, cache=cache)
    pool.close()
    # The pool is closed: a second result can only come from the cache.
    second = check_template(CHATML, file="b.jinja", pool=pool, cache=cache)
    assert first.verdict == second.verdict == SAFE
    assert second.file == "b.jinja"
    assert cache.hits == 1
    assert second.to_dict() == {**first.to_dict(), "file": "b.jinja"}


def test_engine_version_tokenizer_and_options_are_part_of_the_key(
    monkeypatch: pytest.MonkeyPatch, pool: SandboxPool
) -> None:
    cache = MemoryResultCache()
    check_template(MARKER, pool=pool, cache=cache)
    check_template(MARKER, pool=pool, cache=cache, options=CheckOptions(max_output_chars=10**6))
    assert cache.hits == 0
    monkeypatch.setattr(checks, "ENGINE_VERSION", "test-bump")
    report = check_template(MARKER, pool=pool, cache=cache)
    assert cache.hits == 0
    assert report.verdict == UNSAFE


def test_sandbox_failures_are_not_cached() -> None:
    cache = MemoryResultCache()
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    pool = SandboxPool(size=1, limits=SandboxLimits(cpu_seconds=1.0))
    try:
        report = check_template(slow, pool=pool, cache=cache)
    finally:
        pool.close()
    assert report.verdict == ERROR
    assert len(cache) == 0


def test_directory_cache_survives_a_new_process_object(tmp_path: Path, pool: SandboxPool) -> None:
    first = check_template(MARKER, pool=pool, cache=DirectoryResultCache(tmp_path))
    assert len(list(tmp_path.glob("*.json"))) == 1
    reopened = DirectoryResultCache(tmp_path)
    closed = SandboxPool(size=1)
    closed.close()
    second = check_template(MARKER, pool=closed, cache=reopened)
    assert reopened.hits == 1
    assert second == first


def test_report_round_trips_through_json(pool: SandboxPool) -> None:
    report = check_template(MARKER, pool=pool, cache=None)
    assert report.failures and report.variants and report.seed_check
    assert TemplateReport.from_dict(report.to_dict()) == report


def test_each_template_compiles_once_per_process(pool: SandboxPool) -> None:
    templates = TemplateCache(CheckEnvironment())
    source = TemplateSource({"default": CHATML})
    run_check(source, templates)
    run_check(source, templates)
    assert templates.compilations == 1
    # In the sandbox worker too: the second job on the same template compiles nothing new.
    job = sandbox_job(TemplateSource({"default": CHATML + " "}), "x", CheckOptions(), None)
    solo = SandboxPool(size=1)
    try:
        before = solo.run(job)["compilations"]
        after = solo.run(job)["compilations"]
    finally:
        solo.close()
    assert after == before
