"""`make run` keeps the site up: a killed worker or beat is restarted, Ctrl-C still stops all."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from cachesafe.management.commands.serve import STOP_GRACE_SECONDS
from tests.conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.worker

T = TypeVar("T")
#: A running `manage.py serve`: the process, its base URL and the file it logs to.
Served = tuple[subprocess.Popen[bytes], str, Path]


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def status_of(url: str) -> int | None:
    """The HTTP status of GET `url`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def processes() -> dict[int, tuple[int, list[str]]]:
    """Every live process: pid -> (parent pid, argv). Zombies are dead and left out."""
    table: dict[int, tuple[int, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited while we looked
        # The command name in parentheses may hold spaces; the fields after it do not.
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if state not in {"Z", "X"}:
            table[int(entry.name)] = (int(ppid), [arg.decode(errors="replace") for arg in argv])
    return table


def descendants(root: int) -> set[int]:
    table = processes()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def survivors(pids: set[int]) -> dict[int, str]:
    """Which of `pids` still run, each with its command line (to say who outlived whom)."""
    return {pid: " ".join(argv) for pid, (_, argv) in processes().items() if pid in pids}


def child_running(serve: int, role: str) -> int | None:
    """The pid of serve's child running `celery ... <role>` (worker or beat), if there is one."""
    for pid, (ppid, argv) in processes().items():
        if ppid == serve and "celery" in argv and role in argv:
            return pid
    return None


@pytest.fixture
def serve(embedded_env: dict[str, str], tmp_path: Path) -> Iterator[Served]:
    """`manage.py serve` with the embedded defaults, answering on a free port."""
    port = free_port()
    embedded_env.update(PORT=str(port), HOST="127.0.0.1")
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        # A file, not a pipe: nobody reads a pipe while the test runs, and a full one blocks.
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve"],
            cwd=REPO_ROOT,
            env=embedded_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    seen: set[int] = set()
    try:
        wait_for(lambda: status_of(f"{base}/") == 200, 90, f"the site: {log_path.read_text()}")
        yield proc, base, log_path
    finally:
        if proc.poll() is None:
            seen = descendants(proc.pid)
            proc.kill()
            proc.wait()
        for pid in seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_and_see_restarted(
    proc: subprocess.Popen[bytes], base: str, log_path: Path, role: str
) -> None:
    """SIGKILL serve's `role` child: the site keeps answering and a new one appears within 1 s."""
    old = wait_for(lambda: child_running(proc.pid, role), 30, f"the {role}")
    old_group = descendants(old)
    os.kill(old, signal.SIGKILL)
    killed_at = time.monotonic()
    answers: list[int | None] = []
    new: int | None = None
    # Watch the site for a few seconds whatever happens: it must not blink.
    while time.monotonic() - killed_at < 4 or new is None:
        assert time.monotonic() - killed_at < 15, f"no new {role}: {log_path.read_text()[-3000:]}"
        answers.append(status_of(f"{base}/"))
        new = new or child_running(proc.pid, role)
        time.sleep(0.3)
    assert new != old
    assert set(answers) == {200}, answers
    assert len(answers) >= 5
    log = log_path.read_text()
    assert re.search(rf"serve: {role} \(pid {old}\) was killed by SIGKILL; restarting in 1 s", log)
    assert f"serve: {role} restarted (pid {new})" in log
    # The dead leader's pool processes went with it.
    assert not old_group & set(processes())


@pytest.mark.timeout(240)
def test_a_killed_worker_or_beat_is_restarted_and_the_site_stays_up(
    serve: Served,
) -> None:
    proc, base, log_path = serve
    kill_and_see_restarted(proc, base, log_path, "worker")
    kill_and_see_restarted(proc, base, log_path, "beat")

    running = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=STOP_GRACE_SECONDS + 5) == 0
    assert not running & set(processes()), "a child of serve outlived it"
    assert status_of(f"{base}/") is None


@pytest.mark.timeout(240)
def test_serve_killed_outright_takes_its_children_along(serve: Served) -> None:
    """`kill -9` of serve itself (no Ctrl-C reaches children in groups of their own)."""
    proc, base, log_path = serve
    wait_for(lambda: child_running(proc.pid, "worker"), 30, "the worker")
    running = descendants(proc.pid)
    assert running
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + STOP_GRACE_SECONDS + 20
    while (left := survivors(running)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"serve's children outlived it: {left}"
    assert status_of(f"{base}/") is None
    assert "serve: died without stopping web, worker, beat; stopping them" in log_path.read_text()


#: A child that ignores SIGTERM, as a worker finishing a long task or a beat that missed the
#: signal (workers/beat.py) looks to serve.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('stubborn', flush=True); time.sleep(600)"
)


@pytest.mark.timeout(60)
def test_a_child_that_ignores_serve_dying_is_killed_after_the_grace(tmp_path: Path) -> None:
    """serve's guardian kills what is left of a child's group once the grace is over."""
    script = (
        "import sys\n"
        "from cachesafe.management.commands import serve\n"
        "serve.STOP_GRACE_SECONDS = 1.0\n"
        f"child = serve.Child('stubborn', [sys.executable, '-c', {STUBBORN!r}])\n"
        "serve.Supervisor([child]).run()\n"
    )
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    stubborn: int | None = None
    try:
        stubborn = wait_for(
            lambda: next(
                (pid for pid, (ppid, argv) in processes().items()
                 if ppid == proc.pid and STUBBORN in argv),
                None,
            ),
            30,
            "the stubborn child",
        )  # fmt: skip
        wait_for(lambda: "stubborn" in log_path.read_text(), 30, "the child to ignore SIGTERM")
        proc.kill()
        proc.wait()
        assert survivors({stubborn}), "the child died with serve: it did not ignore SIGTERM"
        deadline = time.monotonic() + 20
        while survivors({stubborn}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not survivors({stubborn}), "the guardian left the stubborn child running"
        said = log_path.read_text()
        assert "serve: died without stopping stubborn; stopping them" in said
        assert re.search(r"stubborn \(process group \d+\) did not stop in 1 s; killing it", said)
    finally:
        proc.kill()
        if stubborn is not None and survivors({stubborn}):
            os.kill(stubborn, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_web_server_whose_port_was_taken_since_the_check_ends_serve_with_why(
    tmp_path: Path,
) -> None:
    """Another `make run` (from another folder: the lock is per folder) that had not listened
    yet when this one checked the port: the web server failed to listen, and serve restarted
    it every 30 s for ever. Before a restart the port is checked again, and a taken one ends
    serve with the reason, every child stopped."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        script = (
            "import sys\n"
            "from cachesafe.management.commands import serve\n"
            "web = serve.Child('web', [sys.executable, '-c', 'raise SystemExit(1)'],\n"
            f"                 lambda: serve.port_taken('127.0.0.1', {port}))\n"
            "sleep = 'import time; time.sleep(600)'\n"
            "other = serve.Child('worker', [sys.executable, '-c', sleep])\n"
            "sys.exit(f'failed: {serve.Supervisor([web, other]).run()}')\n"
        )
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=45,
        )  # fmt: skip
    said = done.stderr
    assert done.returncode == 1, said
    assert re.search(r"serve: web \(pid \d+\) exited with code 1; restarting in 1 s", said), said
    assert f"failed: web cannot be restarted: Port {port} on 127.0.0.1 is already in use" in said
    assert "stopping everything" in said
    assert "web restarted" not in said
    assert time.monotonic() - started < 15  # the worker was stopped with it, not waited for


@pytest.mark.timeout(60)
def test_a_web_server_whose_port_is_free_is_restarted_as_before(tmp_path: Path) -> None:
    port = free_port()
    script = (
        "import sys\n"
        "from cachesafe.management.commands import serve\n"
        "web = serve.Child('web', [sys.executable, '-c', 'raise SystemExit(1)'],\n"
        f"                 lambda: serve.port_taken('127.0.0.1', {port}))\n"
        "sys.exit(f'ended: {serve.Supervisor([web]).run()}')\n"
    )
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: "web restarted" in log_path.read_text(), 30, "a restart")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 1
    finally:
        proc.kill()
    said = log_path.read_text()
    assert "ended: None" in said and "cannot be restarted" not in said
