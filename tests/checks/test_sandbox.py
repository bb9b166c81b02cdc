"""The sandbox pool: shared by threads, and never leaves workers behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from checks import SandboxPool, check_template
from checks.reports import SAFE, UNSAFE
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


def test_an_interrupted_job_never_answers_the_next_one() -> None:
    """A Celery soft time limit can interrupt the parent mid-job; the late answer is discarded."""
    pool = SandboxPool(size=1)
    slow = "{% for i in range(100000) %}{% for j in range(60) %}{% endfor %}{% endfor %}" + CHATML

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            check_template(slow, pool=pool, cache=None, wall_seconds=30)
        signal.setitimer(signal.ITIMER_REAL, 0)
        report = check_template(MARKER, pool=pool, cache=None)
    finally:
        signal.signal(signal.SIGALRM, previous)
        pool.close()
    assert report.verdict == UNSAFE
    assert pool.restarts == 1
