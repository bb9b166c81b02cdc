"""A pool of long-lived sandbox processes running template checks under wall, memory, CPU limits.

Plain `subprocess` children speaking JSON lines, not multiprocessing: Celery prefork children are
daemonic and may not start multiprocessing children. A worker that overruns its wall time, dies or
runs out of memory is killed and replaced; the job becomes an `error` verdict with the reason.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
GIB = 1024**3


#: CPU seconds one template check may use: the same for the CLI and the service, so a template
#: gets the same verdict wherever it is checked.
DEFAULT_CPU_SECONDS = 10.0
#: The most a caller may give one job: an hour (beyond it the clock's arithmetic overflows).
MAX_CPU_SECONDS = 3600.0


def cpu_budget(text: str) -> float:
    """A `--cpu-seconds` value: a number of seconds above 0, at most MAX_CPU_SECONDS (argparse
    says what is wrong: `inf` overflowed the clock, `nan` and negatives hung until the wall
    guard, and 0 gave what a race decided)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds <= MAX_CPU_SECONDS:  # (False for nan)
        raise argparse.ArgumentTypeError(
            f"{text} s: give more than 0 and at most {MAX_CPU_SECONDS:g} seconds"
        )
    return seconds


#: Wall time is only a last guard, far above the CPU budget: on a loaded machine a job waits
#: for a core, and that must not change its verdict.
WALL_GUARD_FACTOR = 10.0
MIN_WALL_GUARD_SECONDS = 30.0


@dataclass(frozen=True)
class SandboxLimits:
    """What one job may use: CPU time (measured by the worker's own CPU clock, so the verdict
    does not depend on how busy the machine is) and memory; wall time only as a far guard."""

    cpu_seconds: float = DEFAULT_CPU_SECONDS
    memory_bytes: int = GIB

    def wall_guard(self, cpu_seconds: float) -> float:
        return max(MIN_WALL_GUARD_SECONDS, WALL_GUARD_FACTOR * cpu_seconds)


class SandboxError(Exception):
    """A job could not finish in the sandbox; the message is the user-facing reason."""


class _Worker:
    def __init__(self, limits: SandboxLimits) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p
        )
        env["CHECKS_SANDBOX_MEMORY"] = str(limits.memory_bytes)
        # The worker dies with this process (sandbox_worker.die_with_parent), even mid-render.
        env["CHECKS_SANDBOX_PARENT"] = str(os.getpid())
        main_thread = threading.current_thread() is threading.main_thread()
        env["CHECKS_SANDBOX_MAIN_THREAD"] = "1" if main_thread else "0"
        # One thread each: fewer arenas under RLIMIT_AS, and the pool is the parallelism.
        env.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "checks.sandbox_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buffer = b""

    def wait_ready(self, seconds: float) -> bool:
        """The worker prints one line once its imports are done; its jobs' clocks start after."""
        answer = self._read_line(time.monotonic() + seconds)
        return answer is not None and bool(answer.get("ready"))

    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, job: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        """Send a job and wait for its answer; None when the deadline passed or the worker died."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(job).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._read_line(deadline)

    def _read_line(self, deadline: float) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def end_input(self) -> None:
        """Close the worker's stdin: it exits once its current job (if any) is answered."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def close(self) -> None:
        self.end_input()
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


#: How the reasons start of a job the sandbox could not finish for a cause that may not be
#: the template's: killed from outside (by signal 9 too: an operator, the machine's OOM killer,
#: or the template's own memory, which the reason cannot tell apart), an exit, a worker that
#: stopped answering. A service checks such a template again before it keeps the reason as
#: its verdict (`registry.tasks.run_check`).
UNCERTAIN_REASONS = (
    "sandbox process died (signal",
    "sandbox process exited unexpectedly",
    "the sandbox did not answer within",
    "sandbox worker answered another job",
)


def uncertain(reason: str | None) -> bool:
    """Whether a report's reason may not be the template's doing (`UNCERTAIN_REASONS`)."""
    return bool(reason) and str(reason).startswith(UNCERTAIN_REASONS)


def _death_reason(returncode: int | None, limits: SandboxLimits) -> str:
    if returncode is not None and returncode < 0:
        number = -returncode
        if number == signal.SIGXCPU:
            return f"render exceeded its CPU budget of {limits.cpu_seconds:g} s"
        if number in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT):
            return f"sandbox process died (signal {number}), likely past {_gib(limits)} of memory"
        return f"sandbox process died (signal {number})"
    return f"sandbox process exited unexpectedly (code {returncode})"


def _gib(limits: SandboxLimits) -> str:
    return f"{limits.memory_bytes / GIB:g} GiB"


class SandboxPool:
    """Long-lived sandbox workers shared by threads; `run` blocks until a worker is free."""

    def __init__(self, size: int | None = None, limits: SandboxLimits | None = None) -> None:
        self.size = max(1, size or os.cpu_count() or 1)
        self.limits = limits or SandboxLimits()
        self._idle: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._closed = False
        self.restarts = 0
        self._job_ids = itertools.count(1)
        # Workers belong to the process that started them: a forked child (Celery prefork) must
        # not write into its parent's pipes.
        self._pid = os.getpid()
        for _ in range(self.size):
            # Placeholders: workers start on first use, so an unused pool costs nothing.
            self._idle.put(None)
        _live_pools.add(self)

    @property
    def usable(self) -> bool:
        """Open, and owned by this process (a forked child must start a pool of its own)."""
        return not self._closed and self._pid == os.getpid()

    def _spawn(self) -> _Worker:
        worker = _Worker(self.limits)
        try:
            ready = worker.wait_ready(_STARTUP_SECONDS)
        except BaseException:
            # Interrupted while the worker starts (a Celery soft time limit lands anywhere): a
            # half-started worker is never handed a job, and must not outlive this call.
            self._discard(worker)
            raise
        if not ready:
            worker.kill()
            raise SandboxError("sandbox process did not start")
        with self._lock:
            self._workers.append(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
            self.restarts += 1

    def run(
        self,
        job: dict[str, Any],
        cpu_seconds: float | None = None,
        *,
        wall_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Run one job on a free worker; raises SandboxError with the reason if it cannot finish.

        `cpu_seconds` is the job's budget of CPU time; `wall_seconds` a guard against a worker
        that stops answering (default: far above the budget)."""
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        if os.getpid() != self._pid:
            raise SandboxError("sandbox pool used from a forked process; start one per process")
        cpu = cpu_seconds or self.limits.cpu_seconds
        wall = wall_seconds or self.limits.wall_guard(cpu)
        job_id = next(self._job_ids)
        worker = self._idle.get()
        try:
            if worker is None or not worker.alive():
                worker = self._spawn()
            deadline = time.monotonic() + wall
            try:
                answer = worker.request({**job, "id": job_id, "cpu_seconds": cpu}, deadline)
            except BaseException:
                # Interrupted mid-job (a Celery soft time limit, KeyboardInterrupt): the worker
                # may still answer later, and that answer must never reach another job.
                self._discard(worker)
                worker = None
                raise
            if answer is not None and answer.get("id") != job_id:
                self._discard(worker)
                worker = None
                raise SandboxError("sandbox worker answered another job; it was replaced")
            if answer is None:
                # Before the deadline, no answer is the worker's end (its output closed): wait a
                # moment for its exit status, which says why (a signal, the memory limit).
                returncode = _exit_status(worker.process, deadline)
                self._discard(worker)
                worker = None
                if returncode is None:
                    raise SandboxError(f"the sandbox did not answer within {wall:g} s")
                raise SandboxError(_death_reason(returncode, self.limits))
            if answer.get("exit"):
                self._discard(worker)
                worker = None
                if "memory" in str(answer.get("error", "")):
                    raise SandboxError(f"template used more than {_gib(self.limits)} of memory")
            if not answer.get("ok"):
                raise SandboxError(str(answer.get("error", "sandbox error")))
            return answer
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        """Stop every worker; safe to call twice (atexit calls it too)."""
        self._closed = True
        if os.getpid() != self._pid:
            return  # the parent owns these workers
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.end_input()  # all at once: they exit side by side
        for worker in workers:
            worker.close()


def _exit_status(process: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The worker's exit status, waiting up to 5 s for it when its deadline has not passed
    (its output ends a moment before it is reaped); None while it still runs."""
    if time.monotonic() >= deadline:
        return process.poll()
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


# Starting a worker (interpreter, imports) is not the template's time; a busy host can be slow.
_STARTUP_SECONDS = 30.0

_default_pool: SandboxPool | None = None
_default_lock = threading.Lock()
_live_pools: weakref.WeakSet[SandboxPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    for pool in list(_live_pools):
        pool.close()


def default_pool() -> SandboxPool:
    """The process-wide pool, started on first use (again after a fork) and stopped at exit."""
    global _default_pool
    with _default_lock:
        pool = _default_pool
        if pool is None or not pool.usable:
            _default_pool = pool = SandboxPool()
        return pool
