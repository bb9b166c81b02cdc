"""Benchmark the check engine on the whole visible corpus: `make bench BENCH=checks`
(or `.venv/bin/python bench/bench_checks.py`).

1. The engine as deployed: sandbox pool (one worker per core), every variant, isolation included,
   each template compiled once per worker.
2. The same engine in one process, compiled once per template, against a naive engine that compiles
   the template for every render (measured on a sample: the naive run takes minutes otherwise).
3. A second pass through the result cache: an unchanged template costs a lookup.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from procs import children_rss  # noqa: E402

from checks import CheckInput, MemoryResultCache, SandboxPool, check_templates  # noqa: E402
from checks.engine import run_check  # noqa: E402
from checks.rendering import CheckEnvironment, TemplateCache  # noqa: E402
from checks.sources import TemplateSource, load_source  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus"


def corpus() -> list[tuple[str, TemplateSource]]:
    entries: list[dict[str, Any]] = json.loads((CORPUS / "index.json").read_text())
    items = []
    for entry in sorted(entries, key=lambda e: e["file"]):
        tokens = {k: entry[k] for k in ("bos_token", "eos_token") if entry.get(k)}
        items.append((entry["file"], load_source(CORPUS / "templates" / entry["file"], tokens)))
    return items


def describe(label: str, seconds: list[float], wall: float) -> None:
    print(
        f"{label:<44} {len(seconds) / wall:7.1f} templates/s   wall {wall:6.2f} s   "
        f"median {statistics.median(seconds) * 1000:6.1f} ms   max {max(seconds) * 1000:7.1f} ms"
    )


def in_process(
    items: list[tuple[str, TemplateSource]], cache_size: int
) -> tuple[list[float], float]:
    templates = TemplateCache(CheckEnvironment(), size=cache_size)
    seconds = []
    started = time.perf_counter()
    for file, source in items:
        t0 = time.perf_counter()
        run_check(source, templates, file=file)
        seconds.append(time.perf_counter() - t0)
    return seconds, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--naive-every", type=int, default=7, help="naive run on every Nth file")
    args = parser.parse_args()
    items = corpus()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"corpus: {len(items)} templates, {args.workers} sandbox workers, {os.cpu_count()} cores, "
        f"load average {load} (other work on the machine slows the wall times)"
    )

    cache = MemoryResultCache()
    inputs = [CheckInput(source, file) for file, source in items]
    started = time.perf_counter()
    pool = SandboxPool(size=args.workers)
    reports = check_templates(inputs, pool=pool, cache=cache)
    wall = time.perf_counter() - started
    variants = sum(len(r.variants) for r in reports)
    describe("1. engine, sandbox pool, all variants", [r.elapsed_seconds for r in reports], wall)
    print(f"   {variants} variants; wall includes starting the pool; per-template = in-worker time")

    started = time.perf_counter()
    again = check_templates(inputs, pool=pool, cache=cache)
    wall_cached = time.perf_counter() - started
    memory = children_rss(os.getpid())
    if memory:
        print(f"   sandbox pool after the corpus: {memory}")
    pool.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"   CPU used by the sandbox workers: {children.ru_utime + children.ru_stime:.2f} s "
        "(independent of machine load)"
    )
    assert [r.verdict for r in again] == [r.verdict for r in reports]
    print(
        f"3. re-check, result cache: {wall_cached * 1000:.1f} ms for {len(again)} templates "
        f"({cache.hits} hits)"
    )

    sample = items[:: args.naive_every]
    once, once_wall = in_process(sample, cache_size=256)
    naive, naive_wall = in_process(sample, cache_size=0)
    print(f"2. one process, sample of {len(sample)} templates (every {args.naive_every}th):")
    describe("   compiled once per template", once, once_wall)
    describe("   naive: compiled for every render", naive, naive_wall)
    print(f"   naive / compiled-once: {naive_wall / once_wall:.1f}x slower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
