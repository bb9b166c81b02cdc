"""Pipeline benchmark: 10,000 models sharing the corpus templates, re-checked from scratch by a
real Celery worker. Prints wall time and renders performed: they must scale with unique template
versions × variants, not with models.

Uses PostgreSQL and Redis when reachable on 127.0.0.1 (a database of its own, dropped after),
the embedded SQLite database and filesystem broker otherwise.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus" / "templates"
SIZES = [int(n) for n in os.environ.get("BENCH_MODELS", "1000,10000").split(",")]
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "cachesafe_bench_pipeline"


def postgres_available() -> bool:
    import psycopg

    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=3, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {BENCH_DB}")
        return True
    except psycopg.Error:
        return False


def redis_available() -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=6379, db=7, socket_timeout=2).ping())
    except redis.RedisError:
        return False


def main() -> int:
    """Run each catalog size in a fresh process, so each starts from an empty database."""
    if len(sys.argv) > 1:
        return run(int(sys.argv[1]))
    for size in SIZES:
        print(f"\n--- {size} models ---", flush=True)
        if subprocess.call([sys.executable, __file__, str(size)]) != 0:
            return 1
    return 0


def run(MODELS: int) -> int:  # noqa: N803 - reads as the constant it is within one run
    sys.path.insert(0, str(ROOT))
    var = tempfile.mkdtemp(prefix="cachesafe-bench-")
    os.environ["CACHESAFE_VAR_DIR"] = var
    os.environ["DJANGO_SETTINGS_MODULE"] = "cachesafe.settings"
    use_pg = postgres_available()
    if use_pg:
        os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"
    else:
        os.environ.pop("DATABASE_URL", None)
    if redis_available():
        os.environ["REDIS_URL"] = "redis://127.0.0.1:6379/7"
    else:
        os.environ.pop("REDIS_URL", None)

    import django

    django.setup()
    from django.core.management import call_command

    from registry import pipeline
    from registry.models import (
        CheckRun,
        CheckStatus,
        HubModel,
        ModelStatus,
        NamedTemplate,
        SourceFile,
        TemplateChange,
        TemplateSnapshot,
        TemplateVersion,
    )
    from workers.celery import app

    call_command("migrate", verbosity=0)
    app.control.purge()
    texts = [p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.jinja"))]
    versions = [TemplateVersion.objects.get_or_create_for_text(t)[0] for t in texts]
    print(f"database: {'PostgreSQL' if use_pg else 'SQLite'}; broker: "
          f"{'Redis' if os.environ.get('REDIS_URL') else 'filesystem'}")  # fmt: skip
    print(f"building {MODELS} models over {len(versions)} template versions ...", flush=True)
    models = HubModel.objects.bulk_create(
        HubModel(repo_id=f"bench{i % 97}/model-{i}", author=f"bench{i % 97}", status=ModelStatus.OK)
        for i in range(MODELS)
    )
    snapshots = TemplateSnapshot.objects.bulk_create(
        TemplateSnapshot(
            model=m, commit_sha=f"{i:040x}", source_file=SourceFile.TOKENIZER_CONFIG,
            default_template=versions[i % len(versions)],
        )
        for i, m in enumerate(models)
    )  # fmt: skip
    NamedTemplate.objects.bulk_create(
        NamedTemplate(snapshot=s, name="default", version_id=s.default_template_id)
        for s in snapshots
    )
    for m, s in zip(models, snapshots, strict=True):
        m.current_snapshot = s
    HubModel.objects.bulk_update(models, ["current_snapshot"], batch_size=2000)
    TemplateChange.objects.bulk_create(
        TemplateChange(model=m, commit_sha=s.commit_sha, new_version_id=s.default_template_id)
        for m, s in zip(models, snapshots, strict=True)
    )

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(Path(var) / "worker.log", "wb")  # noqa: SIM115 - kept open for the worker's life
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "default,checks",
         "-c", "2", "-n", "bench@%h", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        started = time.perf_counter()
        dispatched = pipeline.dispatch_template_changes(limit=MODELS)
        dispatch_seconds = time.perf_counter() - started
        deadline = time.monotonic() + 900
        while CheckRun.objects.exclude(status=CheckStatus.DONE).exists():
            if time.monotonic() > deadline or worker.poll() is not None:
                print("worker did not finish; see", log.name, file=sys.stderr)
                return 1
            time.sleep(0.5)
        while HubModel.objects.filter(verdict="pending").exists():
            time.sleep(0.2)
        wall = time.perf_counter() - started
    finally:
        worker.terminate()
        worker.wait(30)

    runs = list(CheckRun.objects.values_list("report", flat=True))
    renders = [int((r or {}).get("renders", 0)) for r in runs]
    elapsed = [float((r or {}).get("elapsed_seconds", 0.0)) for r in runs]
    total_renders = sum(renders)
    print(f"models: {MODELS}  template versions: {len(versions)}  changes dispatched: {dispatched}")
    print(f"check runs: {len(runs)}  (one per unique version; models per run: "
          f"{MODELS / max(1, len(runs)):.0f})")  # fmt: skip
    print(f"renders performed: {total_renders}  per unique version: median "
          f"{statistics.median(renders):.0f}, max {max(renders)}  per model: "
          f"{total_renders / MODELS:.2f}")  # fmt: skip
    print(f"engine time per version: median {statistics.median(elapsed):.3f} s, "
          f"max {max(elapsed):.3f} s")  # fmt: skip
    print(f"dispatch of {MODELS} changes: {dispatch_seconds:.1f} s")
    print(f"wall time, dispatch to every verdict stored: {wall:.1f} s")

    from django.db import connections

    connections.close_all()
    if use_pg:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
