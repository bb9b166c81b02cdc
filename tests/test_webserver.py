"""The web server's settings (cachesafe/webserver.py): a web process caps its malloc arenas, and
the workers are forked from a master that loaded the project and holds no connection."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, free_port
from tests.forking import GARBAGE_OF_THE_MOMENT
from tests.test_serve import wait_for
from tests.workerproc import database_url_for_children

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


KEPT = "from tests.webserver_app import kept_after_large_buffers as kept; print(kept())"
FIXED = "from cachesafe.webserver import fix_malloc_thresholds as fix; assert fix(); " + KEPT


def test_with_fixed_thresholds_large_buffers_freed_are_given_back() -> None:
    """glibc raised its mapping threshold to the size of the largest mapping freed: the
    buffers of later pages came from the heap and stayed there once freed."""
    assert run(KEPT) > 4096  # KiB: most of the 6,000 the thirty buffers took
    assert run(FIXED) < 1024


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

        # The worker's own four threads and the app's six together use two arenas, and the
        # large buffers its request thread freed are given back.
        arenas, kept = wait_for(answer, 30, "gunicorn to answer").split()
        assert int(arenas) == 2 and int(kept) < 1024
    finally:
        server.terminate()
        server.wait(timeout=30)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _database_handles(pid: int, database: dict[str, object]) -> list[str]:
    """What `pid` holds open of the test database: its file (SQLite) or a TCP connection to
    its server's port (PostgreSQL)."""
    if str(database["ENGINE"]).endswith("sqlite3"):
        name = str(Path(str(database["NAME"])).resolve())
        return [
            os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()
            if os.readlink(fd).startswith(name)
        ]  # fmt: skip
    port = f"{int(str(database['PORT'] or 5432)):04X}"
    inodes = _socket_inodes(pid)
    held = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()  # local, remote, state, ..., inode (the tenth)
            if fields[2].endswith(f":{port}") and fields[9] in inodes:
                held.append(line)
    return held


def _memory(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0])
    return fields


def test_the_workers_share_the_project_loaded_once_and_each_connects_on_its_own(
    transactional_db: None, tmp_path: Path
) -> None:
    """The project's own WSGI app through the settings: the master loads it (and its URLconf)
    before forking, so most of a worker's memory is the master's pages, shared; the master
    holds no database connection for its workers to inherit, and every worker still answers
    pages that read the database."""
    from django.db import connection

    port = free_port()
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as output:
        server = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "cachesafe.wsgi",
                "--config", "python:cachesafe.webserver", "--bind", f"127.0.0.1:{port}",
                "--workers", "2", "--access-logfile", "/dev/null",
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "DATABASE_URL": database_url_for_children()},
            stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def status(path: str) -> int | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as page:
                    page.read()
                    return int(page.status)
            except OSError:
                return None

        assert wait_for(lambda: status("/"), 60, f"gunicorn to answer: {log.read_text()}") == 200
        for path in ["/", "/?q=qwen", "/api/models", "/diagnose/", "/feeds/changes.atom"] * 4:
            assert status(path) == 200, (path, log.read_text())
        master = server.pid
        with open(f"/proc/{master}/maps") as maps:
            mapped = maps.read()
        # pydantic's compiled core comes with the API, which only the URLconf imports.
        assert "_pydantic_core" in mapped
        assert _database_handles(master, connection.settings_dict) == []
        workers = [
            int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()
        ]
        assert len(workers) == 2
        for worker in workers:
            memory = _memory(worker)
            private = memory["Private_Clean"] + memory["Private_Dirty"]
            # Not forked from a loaded master, three quarters of a worker is its own.
            assert private < memory["Rss"] / 2, memory
    finally:
        server.terminate()
        server.wait(timeout=30)


BEFORE_FORK = (
    """
import gc, sys
import django
django.setup()
from django.db import connection
from cachesafe.webserver import load_before_fork, pre_fork
connection.ensure_connection()
load_before_fork()
assert connection.connection is None, "a connection the workers would share"
assert "dashboard.views" in sys.modules and "ninja" in sys.modules
"""
    + GARBAGE_OF_THE_MOMENT
    + """
frozen = gc.get_freeze_count()
pre_fork(None, None)
assert gone() is None, "garbage frozen for ever"
print(frozen, gc.get_freeze_count())
"""
)


def test_before_forking_the_master_loads_the_views_closes_its_connections_and_freezes(
    db: None,
) -> None:
    """The hooks alone, in a process of their own (freezing is for the whole process)."""
    done = subprocess.run(
        [sys.executable, "-c", BEFORE_FORK],
        cwd=REPO_ROOT,
        env={**os.environ, "DATABASE_URL": database_url_for_children()},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    before, after = (int(n) for n in done.stdout.split())
    assert before == 0 and after > 10_000  # every object loaded so far


def test_a_worker_starts_the_status_check_as_it_is_forked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`post_fork` starts the banner's first check in the new worker (workers/health.py)."""
    from cachesafe import webserver
    from workers import health

    started: list[bool] = []
    monkeypatch.setattr(webserver, "limit_malloc_arenas", lambda: True)
    monkeypatch.setattr(health, "refresh_soon", lambda: started.append(True))
    webserver.post_fork(None, None)
    assert started == [True]


FIRST_PAGES = """
import sys
import django
django.setup()
import jinja2
from django.template.base import Template
from django.test import Client
from django.urls.resolvers import URLResolver
from cachesafe.webserver import load_before_fork
if sys.argv[1] == "loaded":
    load_before_fork()
built = []
def counting(owner, name):
    original = getattr(owner, name)
    def wrapper(self, *args, **kwargs):
        built.append(f"{owner.__name__}.{name}")
        return original(self, *args, **kwargs)
    setattr(owner, name, wrapper)
counting(Template, "compile_nodelist")
counting(jinja2.Environment, "_compile")
counting(URLResolver, "_populate")
client = Client()
for path in ["/", "/?q=qwen", "/?q=qwen&sort=name", "/diagnose/", "/feeds/changes.atom"]:
    assert client.get(path).status_code == 200, path
print(len(built), sorted(set(built)))
"""


def first_pages_build(state: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", FIRST_PAGES, state],
        cwd=REPO_ROOT,
        env={**os.environ, "DATABASE_URL": database_url_for_children()},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[0])


def test_a_worker_forked_from_the_master_compiles_nothing_for_its_first_pages(
    transactional_db: None,
) -> None:
    """What the master loads before forking covers the first pages a worker serves: no
    template compiled, no URL lookup table filled, so a new worker's first search costs what
    its second does, less its connections. Without the hook the same pages compile dozens."""
    assert first_pages_build("bare") > 10
    assert first_pages_build("loaded") == 0


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
