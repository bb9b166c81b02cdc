"""A long-lived sandbox process: reads check jobs as JSON lines on stdin, answers on stdout.

Started by `checks.sandbox.SandboxPool` with `python -m checks.sandbox_worker`. It caps its own
address space (RLIMIT_AS) and, per job, its CPU time (RLIMIT_CPU), compiles each template once
(LRU by sha256) and runs a whole template check per round-trip.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import IO, Any

from checks.engine import run_check, template_line
from checks.options import CheckOptions
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import checked_on_bytes
from checks.sources import TemplateSource

Encoder = Callable[[str], list[int]]


class TokenizerCache:
    """Tokenizers by sha256 of their tokenizer.json; `tokenizers` is imported only when needed."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._encoders: OrderedDict[str, Encoder] = OrderedDict()

    def get(self, sha256: str, text: str) -> Encoder:
        encoder = self._encoders.get(sha256)
        if encoder is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(text)

            def encoder(value: str) -> list[int]:
                return list(tokenizer.encode(value, add_special_tokens=False).ids)

            self._encoders[sha256] = encoder
            if len(self._encoders) > self.size:
                self._encoders.popitem(last=False)
        return encoder


def limit_memory(max_bytes: int) -> None:
    if max_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))


class CpuBudgetExceeded(BaseException):
    """Raised in the render by SIGPROF when the job used its CPU budget. A BaseException, so
    the engine's own `except Exception` around a render cannot swallow it."""


def _budget_spent(signum: int, frame: object) -> None:
    raise CpuBudgetExceeded


def start_cpu_budget(seconds: float) -> None:
    """Interrupt this job after `seconds` of this process's CPU time (user + system): CPU time,
    not wall time, so the verdict is the same on an idle and on a loaded machine."""
    signal.signal(signal.SIGPROF, _budget_spent)
    signal.setitimer(signal.ITIMER_PROF, seconds)


def _cpu_time() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def stop_cpu_budget() -> None:
    signal.setitimer(signal.ITIMER_PROF, 0)


def limit_cpu(seconds: float) -> None:
    """Backstop: the kernel kills a job whose CPU runs past `seconds` from now (a render stuck in
    C code, where the budget's signal cannot interrupt it)."""
    if seconds <= 0:
        return
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(spent + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def handle(job: dict[str, Any], templates: TemplateCache, tokenizers: TokenizerCache) -> Any:
    source = TemplateSource(
        dict(job["templates"]),
        dict(job["special_tokens"]),
        origin=job["origin"],
        sha256=job["sha256"],
    )
    # The diagnosis and pair renders are imported by the first job that needs them: most
    # workers only ever check templates, and a worker's start is waited for.
    if job.get("kind") == "diagnose":
        from checks.diagnose import ClientRequest, diagnose_source

        encoder, _ = job_encoder(job, tokenizers)
        requests = [ClientRequest.from_dict(r) for r in job["requests"]]
        pairs = diagnose_source(source, requests, templates, encoder)
        return {"ok": True, "pairs": [pair.to_dict() for pair in pairs]}
    if job.get("kind") == "render_pair":
        from checks.pairs import PairRequest, PairUnavailable, render_pair

        try:
            pair = render_pair(source, PairRequest.from_dict(job["pair"]), templates)
        except PairUnavailable as exc:
            return {"ok": True, "unavailable": str(exc)}
        return {"ok": True, "pair": pair}
    encoder, unreadable = job_encoder(job, tokenizers)
    report = run_check(
        source,
        templates,
        file=job["file"],
        options=CheckOptions.from_dict(job["options"]),
        tokens=encoder,
        tokenizer_sha=job.get("tokenizer_sha256"),
    )
    if unreadable:
        report = replace(report, summary=checked_on_bytes(report.summary, unreadable))
    return {"ok": True, "report": report.to_dict(), "compilations": templates.compilations}


def job_encoder(job: dict[str, Any], tokenizers: TokenizerCache) -> tuple[Encoder | None, str]:
    """The job's tokenizer, or None and why not: a tokenizer.json this `tokenizers` cannot
    read (cut short, an LFS pointer, a newer format) costs the token-level checks, not the
    template's verdict."""
    if job.get("tokenizer_json") is None:
        return None, ""
    try:
        return tokenizers.get(job["tokenizer_sha256"], job["tokenizer_json"]), ""
    except Exception as exc:  # noqa: BLE001 - anything `tokenizers` raises on bad input
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None, f"the tokenizer.json could not be read ({reason.rstrip('.')})"


def serve(stdin: IO[str], stdout: IO[str]) -> None:
    templates = TemplateCache(CheckEnvironment())
    tokenizers = TokenizerCache()
    stdout.write(json.dumps({"ready": True}) + "\n")
    stdout.flush()
    for line in stdin:
        job = json.loads(line)
        budget = float(job.get("cpu_seconds", 0))
        limit_cpu(2 * budget + 1)
        started = _cpu_time()
        try:
            if budget > 0:
                start_cpu_budget(budget)
            try:
                answer = handle(job, templates, tokenizers)
            finally:
                stop_cpu_budget()
        except CpuBudgetExceeded as exc:
            at = template_line(exc)
            where = f" (at template line {at})" if at is not None else ""
            answer = {
                "ok": False,
                "error": f"render exceeded its CPU budget of {budget:g} s{where}",
            }
        except MemoryError:
            # Memory may be fragmented past use: answer, then let the parent start a fresh worker.
            answer = {"ok": False, "error": "template used more memory than allowed", "exit": True}
        except RecursionError:
            answer = {"ok": False, "error": "template recursion too deep"}
        except Exception as exc:  # noqa: BLE001 - any failure becomes an error verdict upstream
            said = str(exc) if getattr(exc, "worded", False) else f"{type(exc).__name__}: {exc}"
            answer = {"ok": False, "error": said[:500]}
        answer["id"] = job.get("id")
        answer["cpu_used"] = round(_cpu_time() - started, 4)
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
        if answer.get("exit"):
            return


#: How often the watchdog looks for its parent.
PARENT_POLL_SECONDS = 0.1
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, kernel_signal: bool) -> None:
    """Exit as soon as the process that started us is gone, even in the middle of a render.

    The kernel's parent-death signal (Linux `PR_SET_PDEATHSIG`) fires when the *thread* that
    spawned us ends, not the process, so it is asked for only when the pool spawned us from its
    main thread. A watchdog thread covers every case and every OS: it polls our parent pid, and
    the interpreter switches to it every few milliseconds even while a template loops.
    """
    if kernel_signal and sys.platform == "linux":
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still covers it

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(70)

    if os.getppid() != parent_pid:
        os._exit(70)  # the parent died while we started
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def main() -> None:
    parent = os.environ.get("CHECKS_SANDBOX_PARENT", "")
    if parent.isdigit():
        die_with_parent(int(parent), os.environ.get("CHECKS_SANDBOX_MAIN_THREAD") == "1")
    limit_memory(int(os.environ.get("CHECKS_SANDBOX_MEMORY", "0")))
    # Deep but bounded recursion: a runaway macro hits RecursionError, not a C stack overflow.
    sys.setrecursionlimit(3000)
    serve(sys.stdin, sys.stdout)
    # Every answer is flushed and nothing else is kept: skip the interpreter's teardown (tens
    # of milliseconds of freeing modules), which a closing pool would wait for.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
