"""A worker's main process freezes what it loaded before it forks a pool process
(workers/celery.py), so the pool processes' garbage collections leave the shared objects alone;
a pool process's own forks freeze nothing of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.forking import GARBAGE_OF_THE_MOMENT

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork")

FORKS = (
    """
import gc, os
import django
django.setup()
from celery.signals import worker_init
import workers.celery

def forked(report):
    pid = os.fork()
    if pid == 0:
        report()
        os._exit(0)
    os.waitpid(pid, 0)

before = gc.get_freeze_count()
worker_init.send(sender=None)  # as a worker's main process starts
"""
    + GARBAGE_OF_THE_MOMENT
    + """
def pool_process():
    print("pool", gc.get_freeze_count(), flush=True)
    made_here = [[n] for n in range(50_000)]
    frozen = gc.get_freeze_count()
    forked(lambda: None)  # a pool process forking in turn
    print("pool after its own fork", frozen, gc.get_freeze_count(), flush=True)
forked(pool_process)
print("main", before, gc.get_freeze_count(), flush=True)
print("garbage kept", int(gone() is not None), 0, flush=True)
"""
)


def test_the_main_process_freezes_before_forking_and_a_pool_process_does_not() -> None:
    """In a process of its own: freezing is for the whole process."""
    done = subprocess.run(
        [sys.executable, "-c", FORKS], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = {line.rsplit(" ", 2)[0]: line.split()[-2:] for line in done.stdout.splitlines()}
    main_before, main_after = (int(n) for n in lines["main"])
    assert main_before == 0 and main_after > 10_000  # Django and the project, frozen
    pool = int(done.stdout.split("pool ")[1].split()[0])
    # What the pool process inherited, frozen (less the few frozen objects freed since).
    assert main_after - 100 < pool <= main_after
    frozen, after_own_fork = (int(n) for n in lines["pool after its own fork"])
    assert after_own_fork <= frozen  # its 50,000 lists stay its own to collect
    assert lines["garbage kept"][0] == "0"  # collected before the freeze, not kept for ever
