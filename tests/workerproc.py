"""A real Celery worker process for tests, sharing the test database and the test broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from django.db import connection

from tests.conftest import REPO_ROOT


def database_url_for_children() -> str:
    """The URL of the database this test uses (pytest-django's test database)."""
    db: dict[str, Any] = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class WorkerProcess:
    """`celery -A workers worker` in its own process group, logging to a file."""

    def __init__(
        self,
        log_dir: Path,
        queues: str = "default,hub,checks,notify",
        concurrency: int = 1,
        extra_env: dict[str, str] | None = None,
        pool: str = "prefork",
    ) -> None:
        self.name = f"test-{uuid.uuid4().hex[:8]}"
        self.hostname = ""
        self.log_path = log_dir / f"{self.name}.log"
        self.queues = queues
        self.concurrency = concurrency
        self.pool = pool
        self.env = {**os.environ, "DATABASE_URL": database_url_for_children(), **(extra_env or {})}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> WorkerProcess:
        from workers.models import WorkerHeartbeat

        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "workers", "worker",
                "-Q", self.queues, "-n", f"{self.name}@%h", "-c", str(self.concurrency),
                "--pool", self.pool,
                "--loglevel", "INFO", "--without-gossip", "--without-mingle",
            ],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        if wait:

            def reported() -> WorkerHeartbeat | None:
                if self.proc is not None and self.proc.poll() is not None:
                    raise AssertionError(
                        f"worker {self.name} exited with {self.proc.returncode}: {self.log()}"
                    )
                return WorkerHeartbeat.objects.filter(hostname__startswith=self.name).first()

            row = wait_for(reported, 60, f"worker {self.name} to report")
            self.hostname = row.hostname
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill_everything(self) -> None:
        """SIGKILL the worker and its pool children at once, as a crash or OOM kill would."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
