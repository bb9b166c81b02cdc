"""The sandbox pool: shared by threads, and never leaves workers behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from checks import (
    CheckOptions,
    SandboxLimits,
    SandboxPool,
    TemplateSource,
    check_template,
    sandbox,
    sandbox_job,
)
from checks.reports import ERROR, SAFE, UNSAFE
from tests.checks.conftest import CHATML

REPO = Path(__file__).resolve().parents[2]
MARKER = "{% for m in messages %}{% if loop.last %}!{% endif %}{{ m.content }}{% endfor %}"


def test_threads_share_the_pool() -> None:
    pool = SandboxPool(size=2)
    # Distinct texts (a comment differs), so no result comes from a compile or memo cache.
    texts = [(CHATML if i % 2 else MARKER) + f"{{# {i} #}}" for i in range(8)]
    try:
        with ThreadPoolExecutor(max_workers=4) as executor:
            verdicts = list(
                executor.map(lambda t: check_template(t, pool=pool, cache=None).verdict, texts)
            )
    finally:
        pool.close()
    assert verdicts == [UNSAFE if i % 2 == 0 else SAFE for i in range(8)]
    assert pool.restarts == 0


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose: it runs nothing.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def test_workers_exit_when_their_parent_dies_without_cleanup() -> None:
    script = (
        "import os, checks\n"
        "pool = checks.SandboxPool(size=1)\n"
        "checks.check_template('{{ messages[0].content }}', pool=pool, cache=None)\n"
        "print(pool._workers[0].process.pid, flush=True)\n"
        "os._exit(0)\n"  # no atexit, like a Celery prefork child
    )
    output = run_script(script)
    pid = int(output.stdout.strip())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


@pytest.mark.parametrize("spawned_from", ["main thread", "worker thread"])
def test_a_busy_worker_dies_with_its_parent_killed_by_sigkill(spawned_from: str) -> None:
    """`kill -9` of a Celery pool process: its sandbox child, mid-render, must not live on."""
    # Within the sandbox's range() cap (100,000), and minutes of rendering.
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    slow += CHATML
    script = f"""
import threading, time, checks
pool = checks.SandboxPool(size=1)
if {spawned_from == "main thread"!r}:
    checks.check_template({CHATML!r}, pool=pool, cache=None)  # the worker starts here
threading.Thread(
    target=lambda: checks.check_template({slow!r}, pool=pool, cache=None, cpu_seconds=120),
    daemon=True,
).start()
while not pool._workers:
    time.sleep(0.01)
time.sleep(0.5)  # the job is written and the render loops
print(pool._workers[0].process.pid, flush=True)
time.sleep(60)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline().strip())
        assert _alive(child)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the sandbox worker outlived its killed parent"
    finally:
        parent.kill()


def test_a_forked_child_gets_its_own_workers() -> None:
    """Celery prefork forks after import: parent and child must not share worker pipes."""
    script = f"""
import os, checks
from checks.sandbox import SandboxError, default_pool
text = {CHATML!r}
parent_pool = default_pool()
assert checks.check_template(text, cache=None).verdict == "safe"
pid = os.fork()
if pid == 0:
    try:
        parent_pool.run({{}})
        os._exit(3)
    except SandboxError:
        pass
    ok = checks.check_template(text + "{{# child #}}", cache=None).verdict == "safe"
    os._exit(0 if ok and default_pool() is not parent_pool else 4)
_, status = os.waitpid(pid, 0)
assert checks.check_template(text + "{{# parent #}}", cache=None).verdict == "safe"
print(os.waitstatus_to_exitcode(status))
"""
    output = run_script(script)
    assert output.returncode == 0, output.stderr
    assert output.stdout.strip() == "0"


class Interrupted(Exception):
    pass


SLOW = "{% for i in range(100000) %}{% for j in range(60) %}{% endfor %}{% endfor %}" + CHATML


def test_an_interrupted_job_never_answers_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Celery soft time limit can interrupt the parent mid-job; the late answer is discarded.

    The interrupt is armed when the job is written to a started worker, so it lands while that
    worker renders, however long start-up takes on a busy machine.
    """
    pool = SandboxPool(size=1)
    sent = sandbox._Worker.request

    def send_then_interrupt(
        worker: sandbox._Worker, job: dict[str, Any], deadline: float
    ) -> dict[str, Any] | None:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        return sent(worker, job, deadline)

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        assert check_template(CHATML, pool=pool, cache=None).verdict == SAFE
        [first] = pool._workers
        with monkeypatch.context() as patch:
            patch.setattr(sandbox._Worker, "request", send_then_interrupt)
            with pytest.raises(Interrupted):
                check_template(SLOW, pool=pool, cache=None, cpu_seconds=30)
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert first.process.poll() is not None, "the interrupted worker was left running"
        report = check_template(MARKER, pool=pool, cache=None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        pool.close()
    assert report.verdict == UNSAFE
    assert pool.restarts == 1


def test_an_interrupt_during_worker_start_up_leaves_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Start-up takes about 0.3 s; an interrupt there must not leak a half-started worker."""
    pool = SandboxPool(size=1)
    started: list[sandbox._Worker] = []

    def interrupted_start(worker: sandbox._Worker, seconds: float) -> bool:
        started.append(worker)
        raise Interrupted

    try:
        with monkeypatch.context() as patch:
            patch.setattr(sandbox._Worker, "wait_ready", interrupted_start)
            with pytest.raises(Interrupted):
                check_template(CHATML, pool=pool, cache=None)
        [half_started] = started
        assert half_started.process.poll() is not None, "the half-started worker is still running"
        assert pool._workers == []
        report = check_template(MARKER, pool=pool, cache=None)
    finally:
        pool.close()
    assert report.verdict == UNSAFE
    assert pool.restarts == 1


def busy_cores(count: int) -> list[subprocess.Popen[bytes]]:
    """Processes that keep `count` cores busy (a loaded worker machine), bounded in time."""
    loop = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]


def test_the_same_verdict_on_an_idle_and_on_a_loaded_machine() -> None:
    """The budget is the worker's CPU time: a template just under it is checked on a machine
    whose cores are all busy exactly as on an idle one, and one over it fails on both."""
    heavy = "{% for i in range(4000) %}{% for j in range(400) %}{% endfor %}{% endfor %}"
    template = heavy + CHATML
    probe = SandboxPool(size=1, limits=SandboxLimits(cpu_seconds=120))
    try:
        used = probe.run(
            sandbox_job(TemplateSource({"default": template}), "t", CheckOptions(), None)
        )["cpu_used"]
    finally:
        probe.close()
    under = SandboxLimits(cpu_seconds=round(used * 1.6 + 0.5, 1))
    over = SandboxLimits(cpu_seconds=max(0.2, round(used * 0.4, 1)))

    def verdicts() -> tuple[str, str]:
        found = []
        for limits in (under, over):
            pool = SandboxPool(size=1, limits=limits)
            try:
                found.append(check_template(template, pool=pool, cache=None).verdict)
            finally:
                pool.close()
        return found[0], found[1]

    idle = verdicts()
    hogs = busy_cores(os.cpu_count() or 2)
    try:
        loaded = verdicts()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert idle == loaded == (SAFE, ERROR), (used, idle, loaded)


def test_a_worker_killed_mid_job_is_said_to_have_died_not_to_be_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its output ends a moment before it is reaped: the reason waits for its exit status, and
    says it died of the signal, not that it did not answer within the wall guard (3 runs of 5
    said so before)."""
    pool = SandboxPool(size=1)
    sent = sandbox._Worker.request

    def send_then_kill(
        worker: sandbox._Worker, job: dict[str, Any], deadline: float
    ) -> dict[str, Any] | None:
        threading.Timer(0.2, os.kill, (worker.process.pid, signal.SIGKILL)).start()
        return sent(worker, job, deadline)

    try:
        assert check_template(CHATML, pool=pool, cache=None).verdict == SAFE
        monkeypatch.setattr(sandbox._Worker, "request", send_then_kill)
        reasons = [
            check_template(SLOW + f"{{# {n} #}}", pool=pool, cache=None, cpu_seconds=30).reason
            for n in range(3)
        ]
    finally:
        pool.close()
    assert all(str(reason).startswith("sandbox process died (signal 9)") for reason in reasons), (
        reasons
    )
