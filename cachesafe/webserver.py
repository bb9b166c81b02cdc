"""The web server's settings, one place for every way it runs: the Docker image and docker
compose, `manage.py serve` and the pages benchmark all start
`gunicorn cachesafe.wsgi --config python:cachesafe.webserver` (serve asks for two processes on a
developer's machine).

Threads share their process's memory, and glibc gives each new thread a malloc arena of its own
(up to eight a core), each keeping its freed memory. Capped at two, a web process with four
threads holds 2 to 3 MiB less after the pages benchmark (docs/dashboard.md). The cap is set
in each worker before its threads start: `MALLOC_ARENA_MAX` in the environment is read only
when a process starts, and gunicorn's workers are forked from the master. The worker also fixes
malloc's thresholds, so that a page's large buffers are given back when freed
(`fix_malloc_thresholds`).

The application is loaded once, in the master, before the workers are forked (`preload_app`):
the modules (most of what a worker holds) are then shared by the master and every worker, page
for page, until one of them writes to a page. Python writes to an object's header when it
counts a reference or collects garbage; the master collects, then freezes what it loaded
before each fork, so the workers' collections leave those objects alone. A worker forked from
it must not inherit an open connection: the master closes Django's before the first fork, and
opens no other (the page cache, Redis, the broker and the Hub are connected to on a request, in
the worker). Loaded once, the code is also read once: a `HUP` forks new workers from the same
code, so a deployment restarts the server for new code, as the image and docker compose do.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import sysconfig
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

workers = 3
threads = 4
accesslog = "-"
#: No control socket (gunicorn 27's `gunicornc`): nothing here uses it, and every gunicorn a
#: user starts would otherwise listen on the same `~/.gunicorn/gunicorn.ctl`.
control_socket_disable = True
#: Load the application in the master and fork the workers from it (see above).
preload_app = True

#: malloc arenas a web process may use (glibc's own limit is eight a core).
MALLOC_ARENAS = 2
#: Allocations of this size or more get a mapping of their own, unmapped when freed.
MMAP_THRESHOLD = 64 * 1024
#: Free memory at the top of a heap past this size is given back to the system.
TRIM_THRESHOLD = 128 * 1024
#: glibc's `mallopt` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def _mallopt(param: int, value: int) -> bool:
    """glibc's `mallopt`: True when the C library took the value; False where it has none
    (macOS) or refused it."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(param, value))


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap the malloc arenas of this process, for threads started from now on. True when the C
    library took the cap."""
    return _mallopt(_M_ARENA_MAX, arenas)


def fix_malloc_thresholds(mmap_at: int = MMAP_THRESHOLD, trim_at: int = TRIM_THRESHOLD) -> bool:
    """Keep a page's large, short-lived buffers out of the heap. glibc maps an allocation of
    128 KiB or more on its own, but each time such a mapping is freed it raises that threshold
    to its size (up to 32 MiB), and the trim threshold to twice that: after one large page,
    every later buffer of a few hundred KiB comes from the heap, and what is freed there stays
    the process's. Set, the thresholds stay where they are put. True when both were taken.

    A process that had mapped and freed 8 MiB once, then held thirty 200 KiB buffers and freed
    them, kept 6.0 MiB more than before them; with these thresholds, 0.2
    (`tests/test_webserver.py`). In the pages benchmark it took 1.5 to 2 MiB off each web worker
    (docs/dashboard.md, "A page's large buffers given back")."""
    return _mallopt(_M_MMAP_THRESHOLD, mmap_at) & _mallopt(_M_TRIM_THRESHOLD, trim_at)


def post_fork(server: Any, worker: Any) -> None:
    """gunicorn's hook, in each worker before it starts its threads: cap the malloc arenas and
    fix its thresholds, and start the status banner's first check (workers/health.py), which
    needs connections of the worker's own, so that its first page does not wait for it."""
    if not (limit_malloc_arenas() and fix_malloc_thresholds()):
        logger.info("malloc arenas and thresholds not set: this C library has no mallopt")
    from django.apps import apps

    if apps.ready:
        from workers.health import refresh_soon

        refresh_soon()


def load_before_fork() -> None:
    """In the master, once the application is loaded: load what every worker's first
    requests would, so that it too is shared and no worker builds it again (the URLconf with
    every view and its reverse lookup tables, the project's templates compiled, the static
    files' manifest), and close any database connection loading opened. Without it each
    worker's first search page took 100 to 126 ms against 13 to 16 once warm, nearly all of
    it compiling templates and filling the URL lookup tables (docs/dashboard.md, "A worker's
    first page"). Nothing to do for an application that is not this Django project (the
    settings' own tests serve one)."""
    from django.apps import apps

    if not apps.ready:
        return
    from django.core.files.storage import storages
    from django.db import connections
    from django.urls import get_resolver

    resolver = get_resolver()
    resolver.url_patterns  # noqa: B018 - importing the URLconf imports every view
    fill_reverse_tables(resolver)
    for engine, name in project_templates():
        engine.get_template(name)
    storages["staticfiles"]  # noqa: B018 - reads the manifest of hashed names, if any
    connections.close_all()


def fill_reverse_tables(resolver: Any, namespace: str = "") -> None:
    """Fill the tables `reverse()` and `{% url %}` read: the root's, then each namespace's,
    which Django builds apart on its first reverse in that namespace (a name no view has
    still builds it)."""
    from django.urls import NoReverseMatch, reverse

    if namespace:
        with contextlib.suppress(NoReverseMatch):
            reverse(f"{namespace}:-")
    else:
        resolver.reverse_dict  # noqa: B018 - reading it fills it
    for name, (_, inner) in resolver.namespace_dict.items():
        fill_reverse_tables(inner, f"{namespace}:{name}" if namespace else name)


def project_templates() -> list[tuple[Any, str]]:
    """Each template engine with the names of the project's own templates (its directories
    under the project's root, not those of installed packages such as the admin's, which few
    visitors' requests render), in a stable order."""
    from django.conf import settings
    from django.template import engines

    root = Path(settings.BASE_DIR).resolve()
    packages = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    found = []
    for engine in engines.all():
        for directory in engine.template_dirs:
            base = Path(directory).resolve()
            if not base.is_relative_to(root) or any(base.is_relative_to(p) for p in packages):
                continue
            found += [
                (engine, path.relative_to(base).as_posix())
                for path in sorted(base.rglob("*"))
                if path.is_file()
            ]
    return found


def on_starting(server: Any) -> None:
    """gunicorn's hook, in the master once the application is loaded (`preload_app`) and
    before it listens: a request that comes in at once waits for a worker, not for this."""
    if server.cfg.preload_app:
        load_before_fork()


def pre_fork(server: Any, worker: Any) -> None:
    """gunicorn's hook, in the master before each fork (a worker that died is forked again):
    collect, then freeze what is left, so no garbage of the moment is kept for ever (a frozen
    object is never collected). The Celery workers' main processes do the same
    (workers/celery.py)."""
    gc.collect()
    gc.freeze()
