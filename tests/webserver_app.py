"""A WSGI app for tests/test_webserver.py: it counts the malloc arenas of the process serving
it, after threads of its own have each allocated from malloc, and what large buffers freed
leave it holding."""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any

#: Threads that allocate at once: more than the cap, fewer than glibc's own limit.
THREADS = 6


def arenas_in_use(threads: int = THREADS) -> int:
    """Start `threads` threads that each allocate (objects over 512 bytes come from malloc, not
    Python's own allocator) and stay alive together, then count the arenas glibc reports."""
    keep: list[list[bytes]] = []
    together = threading.Barrier(threads + 1)
    done = threading.Event()

    def allocate() -> None:
        keep.append([bytes(2048) for _ in range(64)])
        together.wait()
        done.wait()

    started = [threading.Thread(target=allocate) for _ in range(threads)]
    for thread in started:
        thread.start()
    together.wait()
    try:
        return _count_arenas()
    finally:
        done.set()
        for thread in started:
            thread.join()


def _count_arenas() -> int:
    """glibc's `malloc_stats` writes one "Arena N:" paragraph an arena, to file descriptor 2."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            ctypes.CDLL(None).malloc_stats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        return sum(line.startswith(b"Arena ") for line in out.read().splitlines())


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1])


def kept_after_large_buffers() -> int:
    """KiB this process keeps after it maps and frees one 8 MiB buffer, then holds thirty of
    200 KiB together and frees them: what a large page then a few ordinary ones leave behind."""
    large = bytearray(8 << 20)
    del large
    before = _rss_kib()
    held = [bytearray(200 << 10) for _ in range(30)]
    del held
    return _rss_kib() - before


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = f"{arenas_in_use()} {kept_after_large_buffers()}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
