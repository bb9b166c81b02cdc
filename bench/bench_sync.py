"""Benchmark: sync 1,000 repos against the fake Hub, cold then warm (nothing changed).

A cold (first) sync reads a repo's head only; the history before it is backfilled afterwards.
Prints the requests per new repo (target 3), per backfill and per unchanged repo (target 1),
the wall time of a cold pass reading the whole history (as before), head-first one at a time
and `--concurrency` at a time (the fake Hub waits `--latency-ms` per request, a network round
trip), the warm pass, and peak memory. Runs on the embedded defaults (a throwaway SQLite
database, the bucket in a file, the folder broker), or with `--deployed` on PostgreSQL and
Redis as deployed (a throwaway database and Redis db 6); the fake Hub runs as a separate process.
`.venv/bin/python bench/bench_sync.py [--repos N] [--deployed]`
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
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


PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
DEPLOYED_DB = "cachesafe_bench_sync"
DEPLOYED_REDIS = "redis://127.0.0.1:6379/6"


def deploy() -> str:
    """PostgreSQL and Redis for this process, as deployed: a fresh database, an empty Redis db
    (the sends the sync makes wait there; no worker takes them). What this process now uses."""
    import psycopg
    import redis

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DEPLOYED_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DEPLOYED_DB}")
    redis.Redis.from_url(DEPLOYED_REDIS).flushdb()
    os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DEPLOYED_DB}"
    os.environ["REDIS_URL"] = DEPLOYED_REDIS
    # As in production: no SQL kept per query, and the key that DEBUG off requires.
    os.environ["DEBUG"] = "false"
    os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
    return "PostgreSQL and Redis, DEBUG off (as deployed)"


def undeploy() -> None:
    import psycopg
    import redis
    from django.db import connections

    connections.close_all()
    redis.Redis.from_url(DEPLOYED_REDIS).flushdb()
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DEPLOYED_DB} WITH (FORCE)")


def through_worker(model_pks: list[int], processes: int = 2) -> float:
    """Queue the models' first syncs as discovery does (`hub.sync_repos` in batches, through
    the outbox) to a real Celery worker (the hub queue, `processes` processes); the seconds
    from the first send until all are synced."""
    from registry.models import HubModel
    from registry.tracking import enqueue_syncs
    from workers.celery import app

    name = f"bench-sync-{os.getpid()}@localhost"
    log = Path(tempfile.mkstemp(prefix="cachesafe-bench-worker-", suffix=".log")[1])
    with log.open("w") as output:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "hub", "-n", name,
             "--concurrency", str(processes), "--loglevel", "WARNING"],
            cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not app.control.ping(destination=[name], timeout=1.0):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the Celery worker did not start; its log: {log}")
        started = time.perf_counter()
        enqueue_syncs(model_pks)
        pending = HubModel.objects.filter(pk__in=model_pks, last_synced_at__isnull=True)
        deadline = time.monotonic() + 1800
        while pending.exists():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"the worker stopped with {pending.count()} repos not synced; its log: {log}"
                )
            time.sleep(0.05)
        seconds = time.perf_counter() - started
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    log.unlink()  # kept when the worker failed: the errors above name it
    return seconds


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
        "--deployed",
        action="store_true",
        help="PostgreSQL and Redis on 127.0.0.1 (as deployed) instead of the embedded defaults",
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="also report tracemalloc's peak (slows the sync down several times)",
    )
    args = parser.parse_args()

    hub, url = start_hub("--repos", str(args.repos), "--latency-ms", str(args.latency_ms))
    isolate("sync", url)
    backends = deploy() if args.deployed else "SQLite, a file bucket, the folder broker (embedded)"
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

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
            if connection.vendor == "postgresql":
                # The deletes above leave every table full of dead rows, which a user's fresh
                # database does not have, and each series would pay for its predecessors.
                with connection.cursor() as cursor:
                    cursor.execute("VACUUM ANALYZE")

        print(f"load average at start         {load_average()}")
        print(f"fake Hub latency              {args.latency_ms:.0f} ms a request")
        print(f"backends                      {backends}")
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
        # As a user meets it: the first syncs queued (as discovery queues them) and run by a
        # Celery worker with two processes, the deployment's concurrency, from the first send
        # until every repo is synced.
        track_afresh()
        worker_seconds = through_worker(list(HubModel.objects.values_list("pk", flat=True)))
        worker_requests = repo_requests(url)
        reset_log(url)
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
            f"cold sync, Celery worker (2)  {worker_seconds:6.1f} s, {worker_requests} requests "
            f"({len(repo_ids) / worker_seconds:.0f} repos/s, queued as discovery queues them; "
            f"{sequential_seconds / worker_seconds:.1f}x faster than one at a time in-process)"
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
        if args.deployed:
            undeploy()


if __name__ == "__main__":
    sys.exit(main())
