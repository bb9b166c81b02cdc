"""The web server's settings, one place for every way it runs: the Docker image and docker
compose, `manage.py serve` and the pages benchmark all start
`gunicorn cachesafe.wsgi --config python:cachesafe.webserver` (serve asks for two processes on a
developer's machine).

Threads share their process's memory, and glibc gives each new thread a malloc arena of its own
(up to eight a core), each keeping its freed memory. Capped at two, a web process with four
threads holds 2 to 3 MiB less after the pages benchmark (docs/dashboard.md). The cap is set
in each worker before its threads start: `MALLOC_ARENA_MAX` in the environment is read only
when a process starts, and gunicorn's workers are forked from the master.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

logger = logging.getLogger(__name__)

workers = 3
threads = 4
accesslog = "-"
#: No control socket (gunicorn 27's `gunicornc`): nothing here uses it, and every gunicorn a
#: user starts would otherwise listen on the same `~/.gunicorn/gunicorn.ctl`.
control_socket_disable = True

#: malloc arenas a web process may use (glibc's own limit is eight a core).
MALLOC_ARENAS = 2
#: glibc's `mallopt` parameter for the arena limit (malloc.h).
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap the malloc arenas of this process, for threads started from now on. True when the C
    library took the cap; False where it has no `mallopt` (macOS) or refused it."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


def post_fork(server: Any, worker: Any) -> None:
    """gunicorn's hook, in each worker before it starts its threads."""
    if not limit_malloc_arenas():
        logger.info("malloc arenas not capped: this C library has no mallopt")
