"""Shared test set-up. Services are real: PostgreSQL and Redis when DATABASE_URL / REDIS_URL
are set (CI sets both), the embedded SQLite database and filesystem broker otherwise."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = REPO_ROOT.parent / "shared"
CORPUS_DIR = SHARED_DIR / "corpus"
#: A user's clone has no reference corpus beside it: the tests that read it skip there, with
#: this reason. In CI (CI=true) it must be there, and its absence fails those tests instead.
NO_CORPUS = "needs the reference corpus in ../shared/corpus beside the repository (CI has it)"


def corpus_available() -> bool:
    """True when the corpus is beside the repository; under CI its absence is an error."""
    if (CORPUS_DIR / "index.json").is_file():
        return True
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        raise RuntimeError(f"CI runs without the reference corpus: expected {CORPUS_DIR}")
    return False


def require_corpus() -> Path:
    """The corpus folder, or skip the calling test (a user's clone) with a one-line reason."""
    if not corpus_available():
        pytest.skip(NO_CORPUS)
    return CORPUS_DIR


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def broker_not_known_down() -> Iterator[None]:
    """A test that fails a send makes this process skip the broker for a while: not the next."""
    from registry import jobs

    jobs._broker_down_until = 0.0
    yield
    jobs._broker_down_until = 0.0


@pytest.fixture(autouse=True)
def nothing_learned_of_searches() -> Iterator[None]:
    """What a process learned of a search's matches (`dashboard.catalog._more_than`), and of
    the catalog table (its size, its sample), holds for the tables of the test that learned
    it, not the next test's."""
    from dashboard import catalog

    for kept in (catalog._more_than, catalog._table, catalog._sample):
        kept.clear()
    # A test's table is small: its sample is all of it. Of 100 blocks, which ones hold a
    # test's rows depends on where earlier tests' rolled-back rows left them, and with it
    # which way a search is read.
    blocks = catalog.SAMPLE_BLOCKS
    catalog.SAMPLE_BLOCKS = 10**6
    yield
    catalog.SAMPLE_BLOCKS = blocks
    for kept in (catalog._more_than, catalog._table, catalog._sample):
        kept.clear()


def run_cache_keys(pattern: str = "*") -> Iterator[tuple[Any, bytes]]:
    """This run's keys in Redis (tests/bootstrap.py gives the run a cache key prefix of its
    own) matching `pattern` after the prefix, with the client to delete them; none without
    Redis (the embedded cache is a table of the test database)."""
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        return
    import redis

    client = redis.Redis.from_url(redis_url)
    prefix = os.environ["CACHESAFE_CACHE_PREFIX"]
    try:
        for key in client.scan_iter(match=f"{prefix}:*:{pattern}", count=1000):
            yield client, key
    finally:
        client.close()


@pytest.fixture(autouse=True)
def fresh_page_cache(request: pytest.FixtureRequest) -> None:
    """Each database test starts a new generation of every cached page. A test's writes never
    commit, so they bump nothing (bumps go out after commit), and Redis outlives the test: a
    page an earlier test rendered from the same demo catalog would otherwise be served. And no
    page's rebuild lock is held: a render that raised keeps its lock for its life
    (`REBUILD_LOCK_SECONDS`), and while it is held the page's copy is served however old."""
    if request.node.get_closest_marker("django_db") is None:
        return
    from dashboard import page_cache

    page_cache.discard_pending()
    page_cache.bump(page_cache.ALL)
    release_page_locks()


def release_page_locks() -> None:
    """Delete this run's pages' rebuild locks (`fresh_page_cache`)."""
    for client, key in run_cache_keys("*:rebuild"):
        client.delete(key)


@pytest.fixture(autouse=True, scope="session")
def run_cache_keys_removed() -> Iterator[None]:
    """This run's keys are its own (tests/bootstrap.py), some kept without an expiry (the
    pages' generations): removed when the run ends."""
    yield
    for client, key in run_cache_keys():
        client.delete(key)


@pytest.fixture
def corpus_dir() -> Path:
    return require_corpus()


@pytest.fixture
def embedded_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for a child process that uses the embedded defaults in a fresh folder."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env["CACHESAFE_VAR_DIR"] = str(tmp_path / "var")
    env["PYTHONUNBUFFERED"] = "1"
    yield env


@pytest.fixture
def celery_workers(transactional_db: None, tmp_path: Path) -> Iterator[Any]:
    """Start real Celery workers: `celery_workers(**options)` returns a running WorkerProcess."""
    from tests.workerproc import WorkerProcess
    from workers.celery import app

    app.control.purge()
    started: list[WorkerProcess] = []

    def start(wait: bool = True, **options: Any) -> WorkerProcess:
        worker = WorkerProcess(tmp_path, **options)
        started.append(worker)
        return worker.start(wait=wait)

    yield start
    for worker in started:
        worker.stop()
    app.control.purge()
