"""Benchmark: sync 1,000 repos against the fake Hub, cold then warm (nothing changed).

A cold (first) sync reads a repo's head only; the history before it is backfilled afterwards.
Prints the requests per new repo (target 3), per backfill and per unchanged repo (target 1),
the wall time of a cold pass reading the whole history (as before), head-first one at a time
and `--concurrency` at a time (the fake Hub waits `--latency-ms` per request, a network round
trip), the warm pass, and peak memory. Runs on a throwaway SQLite database; the
fake Hub runs as a separate process.
`.venv/bin/python bench/bench_sync.py [--repos N]`
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

from procs import load_average

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = REPO_ROOT.parent / "shared" / "corpus"


def start_hub(*options: str) -> tuple[subprocess.Popen[str], str]:
    """The fake Hub in its own process (`options`: what it serves); its URL once it listens."""
    hub = subprocess.Popen(
        [sys.executable, "-m", "tests.fakehub", "--corpus", str(CORPUS_DIR), *options],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert hub.stdout is not None
    line = hub.stdout.readline().split()
    if not line or line[0] != "ready":
        hub.kill()
        raise SystemExit(f"the fake Hub did not start: {line}")
    return hub, line[1]


def isolate(name: str, url: str, **extra: str) -> Path:
    """This process on embedded defaults in a fresh folder (a throwaway SQLite database),
    reading the Hub at `url`, without its quota (the bucket is tested elsewhere)."""
    work = Path(tempfile.mkdtemp(prefix=f"cachesafe-bench-{name}-"))
    for variable in ("DATABASE_URL", "REDIS_URL", "HUGGING_FACE_HUB_TOKEN"):
        os.environ.pop(variable, None)
    os.environ.update(
        CACHESAFE_VAR_DIR=str(work / "var"),
        HF_HOME=str(work / "hf"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_ENDPOINT=url,
        HF_TOKEN="",
        HF_REQUESTS_PER_5MIN=str(10**9),
        LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="cachesafe.settings",
        **extra,
    )
    sys.path.insert(0, str(REPO_ROOT))
    return work


def hub_stats(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/_fakehub/stats") as response:
        return dict(json.load(response))


def repo_requests(url: str) -> int:
    """Requests about repos (the control calls to the fake Hub itself are left out)."""
    per_repo = hub_stats(url)["per_repo"]
    assert isinstance(per_repo, dict)
    return sum(int(n) for n in per_repo.values())


def reset_log(url: str) -> None:
    request = urllib.request.Request(f"{url}/_fakehub/reset-log", method="POST")
    urllib.request.urlopen(request).close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repos", type=int, default=1000)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="repos read at once, beside one at a time"
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=20,
        help="the fake Hub waits this long per request (a round trip; 0 for loopback)",
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="also report tracemalloc's peak (slows the sync down several times)",
    )
    args = parser.parse_args()

    hub, url = start_hub("--repos", str(args.repos), "--latency-ms", str(args.latency_ms))
    isolate("sync", url)
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from registry.hub import HubClient
        from registry.models import HubModel, TemplateChange, TemplateVersion
        from registry.sync import backfill_histories, sync_repo_ids

        call_command("migrate", verbosity=0)
        repo_ids = list(HubClient().iter_models(limit=args.repos, sort="downloads"))

        def track_afresh() -> None:
            HubModel.objects.all().delete()
            TemplateVersion.objects.all().delete()
            HubModel.objects.bulk_create(
                HubModel(repo_id=r, author=r.split("/")[0], tracked_via="track") for r in repo_ids
            )
            reset_log(url)

        print(f"load average at start         {load_average()}")
        print(f"fake Hub latency              {args.latency_ms:.0f} ms a request")
        # The whole bounded history at the first sync, as before head-first syncs (`force`
        # walks it), one at a time: the same run's baseline.
        track_afresh()
        started = time.perf_counter()
        full = sync_repo_ids(None, force=True)
        full_seconds = time.perf_counter() - started
        full_requests = repo_requests(url)
        # Head-first cold passes, one at a time, then `--concurrency` at a time.
        track_afresh()
        started = time.perf_counter()
        sequential = sync_repo_ids(None)
        sequential_seconds = time.perf_counter() - started
        track_afresh()
        if args.trace_memory:
            tracemalloc.start()
        started = time.perf_counter()
        cold = sync_repo_ids(None, concurrency=args.concurrency)
        cold_seconds = time.perf_counter() - started
        cold_requests = repo_requests(url)
        reset_log(url)

        # The histories the first syncs left for later (beat's hub.backfill_history).
        started = time.perf_counter()
        backfilled = backfill_histories(len(repo_ids))
        backfill_seconds = time.perf_counter() - started
        backfill_requests = repo_requests(url)
        reset_log(url)

        started = time.perf_counter()
        warm = sync_repo_ids(None, concurrency=args.concurrency)
        warm_seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1] if args.trace_memory else 0
        tracemalloc.stop()
        cold += sequential + backfilled + full
        failed = [r for r in cold + warm if r.outcome == "failed"]
        unchanged = [r for r in warm if r.outcome == "unchanged"]
        warm_requests = repo_requests(url)
        print(f"repos                         {len(repo_ids)}")
        print(f"template versions (deduped)   {TemplateVersion.objects.count()}")
        print(f"template changes recorded     {TemplateChange.objects.count()}")
        print(
            f"cold, whole history (before)  {full_seconds:6.1f} s, {full_requests} requests "
            f"({full_requests / len(repo_ids):.1f} per repo), one at a time"
        )
        print(
            f"cold sync, one at a time      {sequential_seconds:6.1f} s "
            f"({len(repo_ids) / sequential_seconds:.0f} repos/s, "
            f"{full_seconds / sequential_seconds:.1f}x faster than the whole history)"
        )
        print(
            f"cold sync, {args.concurrency} at a time        {cold_seconds:6.1f} s, "
            f"{cold_requests} requests ({cold_requests / len(repo_ids):.1f} per repo, "
            f"{len(repo_ids) / cold_seconds:.0f} repos/s, "
            f"{sequential_seconds / cold_seconds:.1f}x faster than one at a time, "
            f"{full_seconds / cold_seconds:.1f}x than the whole history)"
        )
        print(
            f"history backfill, afterwards  {backfill_seconds:6.1f} s, {backfill_requests} "
            f"requests ({backfill_requests / len(repo_ids):.1f} per repo)"
        )
        print(
            f"warm sync (nothing changed)   {warm_seconds:6.1f} s, {warm_requests} requests "
            f"({len(repo_ids) / warm_seconds:.0f} repos/s)"
        )
        print(
            f"requests per unchanged repo   {warm_requests / max(1, len(unchanged)):.2f} (target 1)"
        )
        if args.trace_memory:
            print(f"peak traced Python memory     {peak / 2**20:.1f} MiB")
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"peak RSS of this process      {maxrss / 1024:.1f} MiB")
        print(f"load average at end           {load_average()}")
        if failed:
            print(f"FAILED: {len(failed)} sync(s), e.g. {failed[0].line()}", file=sys.stderr)
            return 1
        return 0 if len(unchanged) == len(repo_ids) else 1
    finally:
        hub.terminate()
        hub.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
