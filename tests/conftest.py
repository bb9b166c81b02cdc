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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def corpus_dir() -> Path:
    if not CORPUS_DIR.is_dir():
        pytest.fail(f"the reference corpus is missing: expected {CORPUS_DIR}")
    return CORPUS_DIR


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
