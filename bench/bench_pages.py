"""Benchmark the dashboard: `make bench BENCH=pages` (or `.venv/bin/python bench/bench_pages.py`).

10,000 models in a PostgreSQL database of its own (created and dropped here), served by gunicorn
on 127.0.0.1, loaded by 20 concurrent clients on loopback (wrk when installed, else a thread pool).
Reports p50/p95 of catalog search, model page and pair diff page beside a trivial Django view
measured in the same run; the target is each page within 3x of the trivial view at p50. Three
series: page cache on (as deployed), on under churn (a writer process makes two writes a second
while the pages are read: an unchanged sync, and a new verdict for one model), and off.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from procs import children_rss, load_average

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachesafe import webserver  # noqa: E402 - the web server's settings, as deployed

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgres://postgres@127.0.0.1:5432/postgres")
DB_NAME = "cachesafe_bench"
DB_URL = PG_ADMIN.rsplit("/", 1)[0] + "/" + DB_NAME
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
MODELS = 10_000
CLIENTS = 20
SECONDS = float(os.environ.get("BENCH_SECONDS", "15"))
KINDS = ("trivial", "search", "model", "diff")
SEARCH_TERMS = [
    "qwen",
    "llama",
    "instruct",
    "chat",
    "coder",
    "7b",
    "gguf",
    "mistral",
    "tools",
    "reasoning",
    "org-1",
    "phi",
    "gemma",
    "xyz-none",
    "awq",
    "moe",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(sql)


def environment(var_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=DB_URL,
        REDIS_URL=REDIS_URL,
        DEBUG="false",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1",
        CACHESAFE_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="pages_site",
        PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT)]),
        LOG_LEVEL="WARNING",
    )
    return env


# --- populating (runs in a child process with the bench environment) --------------------------


def populate() -> dict[str, Any]:
    """10,000 models over 24 template versions, each version checked by the real engine."""
    import django

    django.setup()
    from django.utils import timezone

    from registry.demo import DEMO_DIR
    from registry.models import (
        HubModel,
        ModelStatus,
        SourceFile,
        TemplateChange,
        TemplateSnapshot,
        TemplateVersion,
    )
    from registry.verdicts import check_in_process, record_check

    rng = random.Random(7)
    tokens = {"bos_token": "<s>", "eos_token": "<|im_end|>"}
    texts = sorted(DEMO_DIR.glob("*.jinja"))
    versions = []
    for i in range(24):
        text = texts[i % len(texts)].read_text(encoding="utf-8") + f"\n{{#- revision {i} -#}}"
        versions.append(TemplateVersion.objects.get_or_create_for_text(text)[0])
    families = ["qwen", "llama", "mistral", "phi", "gemma", "deepseek", "granite", "olmo", "smol"]
    kinds = ["instruct", "chat", "coder", "base-chat", "reasoning", "tools", "moe"]
    now = timezone.now()
    models = []
    for i in range(MODELS):
        family = families[i % len(families)]
        author = f"org-{i % 400}"
        models.append(
            HubModel(
                repo_id=f"{author}/{family}-{rng.choice(kinds)}-{i}-"
                + f"{rng.choice([1, 3, 7, 14, 32])}b"
                + rng.choice(["", "-gguf", "-awq", "-mlx"]),
                author=author,
                family=family,
                status=ModelStatus.OK,
                downloads=int(rng.paretovariate(1.2) * 100),
                tags=["text-generation", rng.choice(kinds)],
                model_type=family,
                is_hybrid=rng.random() < 0.1,
                last_template_change_at=now - timedelta(days=rng.randint(0, 700)),
            )
        )
    HubModel.objects.bulk_create(models, batch_size=2000)
    models = list(HubModel.objects.order_by("id"))
    snapshots = [
        TemplateSnapshot(
            model=model,
            commit_sha=f"{model.id:040x}",
            source_file=SourceFile.CHAT_TEMPLATE_JINJA,
            default_template=versions[model.id % len(versions)],
            special_tokens=tokens,
        )
        for model in models
    ]
    TemplateSnapshot.objects.bulk_create(snapshots, batch_size=2000)
    by_model = {s.model_id: s for s in TemplateSnapshot.objects.all()}
    for model in models:
        model.current_snapshot = by_model[model.id]
    HubModel.objects.bulk_update(models, ["current_snapshot"], batch_size=2000)
    changes = []
    for model in models[::5]:
        for n in range(3):
            changes.append(
                TemplateChange(
                    model=model,
                    commit_sha=f"{model.id:032x}{n:08x}",
                    committed_at=now - timedelta(days=100 * (3 - n)),
                    title=f"Update chat template ({n})",
                    old_version=versions[(model.id + n) % len(versions)] if n else None,
                    new_version=versions[(model.id + n + 1) % len(versions)],
                )
            )
    TemplateChange.objects.bulk_create(changes, batch_size=2000)
    from dashboard.stored_reports import failing_pairs, rebuild

    pairs = []
    for version in versions:
        report = rebuild(record_check(version, check_in_process(version, tokens)).report)
        for location in failing_pairs(report)[:2] if report else []:
            variant, session, index = location.url_args
            pairs.append(f"/t/{version.sha256}/pair/{variant}/{session}/{index}/")
    sample = rng.sample(models, 200)
    return {
        "search": [f"/?q={term}" for term in SEARCH_TERMS],
        "model": [f"/m/{m.repo_id}/" for m in sample],
        "diff": pairs,
        "trivial": ["/bench/trivial"],
    }


# --- load ---------------------------------------------------------------------------------


def load_python(port: int, paths: list[str], seconds: float) -> tuple[list[float], int]:
    """CLIENTS threads, each sending requests one after the other until time is up: the
    latencies, and how many of the answers were rendered (not an `X-Cache` hit or stale copy)."""
    latencies: list[float] = []
    rendered = 0
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    errors: list[str] = []

    def client(seed: int) -> None:
        nonlocal rendered
        rng = random.Random(seed)
        local = []
        misses = 0
        while time.monotonic() < deadline:
            path = rng.choice(paths)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            started = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            local.append(time.perf_counter() - started)
            misses += response.getheader("X-Cache") not in ("hit", "stale")
            conn.close()
            if response.status != 200:
                errors.append(f"{path}: {response.status}")
        with lock:
            latencies.extend(local)
            rendered += misses

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")
    return latencies, rendered


WRK_SCRIPT = """
local paths = {%s}
math.randomseed(7)
request = function()
  return wrk.format("GET", paths[math.random(#paths)])
end
response = function(status, headers, body)
  if status ~= 200 then errors = (errors or 0) + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %%d %%d %%d %%d %%d\\n", latency:percentile(50),
    latency:percentile(95), summary.requests, summary.errors.status, summary.duration))
end
"""


def load_wrk(port: int, paths: list[str], seconds: float, workdir: Path) -> dict[str, float]:
    script = workdir / "paths.lua"
    script.write_text(WRK_SCRIPT % ", ".join(json.dumps(p) for p in paths))
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{CLIENTS}",
            f"-d{int(seconds)}s",
            "--timeout",
            "30s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    p50, p95, requests, bad, duration = (int(v) for v in line.split()[1:])
    if bad:
        raise SystemExit(f"{bad} non-2xx answers from {paths[0]}…:\n{out}")
    return {"p50": p50 / 1000, "p95": p95 / 1000, "rps": requests / (duration / 1e6)}


def measure(port: int, paths: list[str], workdir: Path) -> dict[str, float]:
    if shutil.which("wrk"):
        return load_wrk(port, paths, SECONDS, workdir)
    answered, rendered = load_python(port, paths, SECONDS)
    latencies = sorted(answered)
    return {
        "p50": statistics.median(latencies) * 1000,
        "p95": latencies[int(len(latencies) * 0.95)] * 1000,
        "rps": len(latencies) / SECONDS,
        "rendered": rendered,
        "answered": len(latencies),
    }


def wait_for(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("gunicorn did not start")


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def churn(writes_per_second: float = 2.0) -> None:
    """Write as a busy deployment does, until killed: alternately an unchanged repo's sync (only
    quiet fields move) and a new verdict for one model (refresh_verdicts' bulk update and its
    `catalog_changed`). Prints how many writes of each kind it made when stopped."""
    import django

    django.setup()
    from registry.hub import RepoInfo
    from registry.models import HubModel
    from registry.signals import catalog_changed
    from registry.sync import record_unchanged

    ids = list(HubModel.objects.values_list("pk", flat=True))
    rng = random.Random(11)
    counts = {"unchanged_sync": 0, "new_verdict": 0}

    def stop(*_: Any) -> None:
        print(json.dumps(counts), flush=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        model = HubModel.objects.get(pk=rng.choice(ids))
        info = RepoInfo(
            repo_id=model.repo_id,
            sha=model.last_commit_sha,
            last_modified=model.last_commit_at,
            author=model.author,
            private=False,
            gated=False,
            disabled=False,
            downloads=model.downloads + 1,
            likes=model.likes,
            tags=model.tags,
            pipeline_tag=model.pipeline_tag,
            library_name=model.library_name,
            base_model=model.base_model,
            gguf=False,
        )
        record_unchanged(model.pk, info)
        counts["unchanged_sync"] += 1
        time.sleep(1 / writes_per_second)
        other = rng.choice(ids)
        flipped = f"churn {counts['new_verdict']}"
        HubModel.objects.filter(pk=other).update(verdict_summary=flipped)
        catalog_changed.send(sender=HubModel, model_ids=[other], verdicts=True)
        counts["new_verdict"] += 1
        time.sleep(1 / writes_per_second)


def gunicorn_as_deployed(python: str, port: int) -> list[str]:
    """The command serving the application as deployed, on 127.0.0.1:`port`: the image's
    processes and threads (cachesafe/webserver.py), no access log."""
    return [
        str(Path(python).parent / "gunicorn"),
        "cachesafe.wsgi",
        "--config",
        "python:cachesafe.webserver",
        "-b",
        f"127.0.0.1:{port}",
        "--access-logfile",
        os.devnull,
        "--log-level",
        "warning",
    ]


def series(
    python: str,
    env: dict[str, str],
    paths: dict[str, list[str]],
    workdir: Path,
    cache_seconds: int,
    *,
    with_churn: bool = False,
) -> dict[str, dict[str, float]]:
    """Start gunicorn; for each page kind, request every path once, then load it (with the
    churn writer running beside it if asked)."""
    port = free_port()
    server = subprocess.Popen(
        gunicorn_as_deployed(python, port),
        cwd=ROOT,
        env={**env, "BENCH_PAGE_CACHE_SECONDS": str(cache_seconds)},
    )
    writer = None
    try:
        wait_for(port)
        if with_churn:
            writer = subprocess.Popen(
                [python, __file__, "--churn"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
            )
        results = {}
        for kind in KINDS:
            # Warm right before measuring, so no page expires (60 s TTL) during its own run.
            for path in paths[kind] + paths[kind][: webserver.workers * 2]:
                status = get(port, path)
                if status != 200:
                    raise SystemExit(f"{path} answered {status}")
            results[kind] = measure(port, paths[kind], workdir)
        memory = children_rss(server.pid)
        if memory:
            print(f"gunicorn web workers after this series: {memory}")
        return results
    finally:
        if writer is not None:
            writer.send_signal(signal.SIGTERM)
            made, _ = writer.communicate(timeout=30)
            print(f"churn writer: {made.strip()} (writes while the pages were read)")
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def report(label: str, results: dict[str, dict[str, float]]) -> float:
    """Print one series; return the worst p50 ratio to the trivial view."""
    base = results["trivial"]["p50"]
    print(f"\n{label} (load average after it: {load_average()})")
    print(
        f"{'page':<10}{'p50 ms':>9}{'p95 ms':>9}{'req/s':>9}{'p50 / trivial':>15}{'rendered':>10}"
    )
    for kind, r in results.items():
        # The share of answers the server rendered, not served from the page cache (the python
        # client counts it; wrk does not).
        rendered = (
            f"{int(r['rendered']):>7} of {int(r['answered'])}" if "rendered" in r else "      –"
        )
        print(
            f"{kind:<10}{r['p50']:>9.1f}{r['p95']:>9.1f}{r['rps']:>9.0f}{r['p50'] / base:>14.1f}x"
            f"{rendered}"
        )
    return max(r["p50"] / base for k, r in results.items() if k != "trivial")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--populate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--churn", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    if args.populate:
        print(json.dumps(populate()))
        return 0
    if args.churn:
        churn()
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="cachesafe-bench-"))
    env = environment(workdir / "var")
    python = sys.executable
    admin(f"DROP DATABASE IF EXISTS {DB_NAME}")
    admin(f"CREATE DATABASE {DB_NAME}")
    try:
        started = time.monotonic()
        subprocess.run([python, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        subprocess.run(
            [python, "manage.py", "collectstatic", "--noinput", "-v0"],
            cwd=ROOT,
            env=env,
            check=True,
        )
        out = subprocess.run(
            [python, __file__, "--populate"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        paths: dict[str, list[str]] = json.loads(out.strip().splitlines()[-1])
        print(
            f"{MODELS} models ready in {time.monotonic() - started:.0f} s; "
            f"gunicorn as deployed ({webserver.workers} workers, {webserver.threads} threads "
            f"each), {CLIENTS} clients, {SECONDS:g} s per page, "
            f"{'wrk' if shutil.which('wrk') else 'python threads'}",
            flush=True,
        )
        worst = 0.0
        for label, cache_seconds, with_churn in (
            ("page cache on (as deployed)", 60, False),
            ("page cache on, two writes a second (churn)", 60, True),
            ("page cache off", 0, False),
        ):
            results = series(python, env, paths, workdir, cache_seconds, with_churn=with_churn)
            ratio = report(label, results)
            if cache_seconds:
                worst = max(worst, ratio)
        print(
            f"target (page cache on): every page within 3x of the trivial view at p50: "
            f"{'met' if worst <= 3 else f'not met (worst {worst:.1f}x)'}"
        )
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if not args.keep:
            admin(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


if __name__ == "__main__":
    sys.exit(main())
