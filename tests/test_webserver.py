"""The web server's settings (cachesafe/webserver.py): a web process caps its malloc arenas."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import REPO_ROOT, free_port
from tests.test_serve import wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="malloc arenas are glibc's (Linux)"
)

COUNT = "from tests.webserver_app import arenas_in_use; print(arenas_in_use())"
CAPPED = "from cachesafe.webserver import limit_malloc_arenas as cap; assert cap(2); " + COUNT


def run(code: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_capped_threads_share_two_arenas_where_each_had_its_own() -> None:
    assert run(COUNT) > 2  # each of the six threads took an arena of its own
    assert run(CAPPED) == 2


def test_gunicorn_with_the_settings_caps_each_worker() -> None:
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "tests.webserver_app",
            "--config",
            "python:cachesafe.webserver",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--access-logfile",
            "/dev/null",
        ],
        cwd=REPO_ROOT,
    )
    try:

        def answer() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
                    return str(response.read().decode())
            except OSError:
                return None

        # The worker's own four threads and the app's six together use two arenas.
        assert int(wait_for(answer, 30, "gunicorn to answer")) == 2
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_every_deployment_starts_gunicorn_with_these_settings() -> None:
    """The image and compose name the settings and leave processes and threads to them."""
    for name in ("Dockerfile", "docker-compose.yml"):
        lines = [
            line
            for line in (REPO_ROOT / name).read_text().splitlines()
            if "gunicorn" in line and not line.lstrip().startswith("#")
        ]
        assert lines, name
        for line in lines:
            assert "python:cachesafe.webserver" in line, (name, line)
            assert "--workers" not in line and "--threads" not in line, (name, line)
