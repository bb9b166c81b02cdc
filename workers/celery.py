"""The Celery app. Postgres holds the state; Celery only executes (tasks take primary keys).

Each app keeps its tasks in its own `tasks.py` (`shared_task`); this module finds them and routes
every task, by name, to its queue: one table, used for `delay`, `apply_async` and `send_task`
alike, so no call site names a queue.
"""

from __future__ import annotations

import functools
import gc
import os
from typing import Any

from celery import Celery
from celery.signals import (
    beat_init,
    task_postrun,
    task_prerun,
    worker_init,
    worker_ready,
    worker_shutdown,
)
from django.db import close_old_connections
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachesafe.settings")

#: Every queue the project uses. `mlx` is consumed only by the Mac probe worker.
QUEUES = ("default", "hub", "checks", "mlx", "notify")
#: What a main (non-Mac) worker consumes.
MAIN_QUEUES = ("default", "hub", "checks", "notify")

#: Task name → queue. Names are stable (beat rows and queued messages refer to them).
TASK_ROUTES: dict[str, dict[str, str]] = {
    "hub.*": {"queue": "hub"},
    "workers.run_check": {"queue": "checks"},
    "workers.probe_model": {"queue": "mlx"},
    "alerts.*": {"queue": "notify"},
    # The rest (pipeline dispatch, probe reports, heartbeats) goes to `default`.
}

app = Celery("cachesafe")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The modules that define tasks: a worker imports them at start, and a process that only
# sends (a web worker) on its first send (`registry.jobs.task_named`).
app.conf.imports = ("registry.tasks", "alerts.tasks", "workers.tasks", "probe.tasks")

app.conf.update(
    task_routes=TASK_ROUTES,
    task_queues=[Queue(name) for name in QUEUES],
    task_default_queue="default",
    task_ignore_result=True,
    task_acks_late=False,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_connection_timeout=5,
    task_soft_time_limit=300,
    task_time_limit=360,
)

#: Tasks between the database connections Celery itself closes (its Django fixup reads this
#: key as written). Unset, it closes them before and after every task: a new PostgreSQL
#: connection, and a new server process, for each task, whatever `CONN_MAX_AGE` says (Celery
#: 5.6 went back to that). Connections follow Django's request lifecycle instead (below);
#: Celery's fixup still closes the ones a forked pool process inherits.
DB_REUSE_TASKS = 1000
app.conf.update(CELERY_DB_REUSE_MAX=DB_REUSE_TASKS)


def _connections_as_a_request(task: Any) -> None:
    """What Django does around a request, around a task: a connection past `CONN_MAX_AGE`, or
    broken, or left in a transaction, is closed, and the next query checks the connection
    first (`CONN_HEALTH_CHECKS`): a database restarted between two tasks costs a reconnect,
    not a failed task. Not for a task run eagerly, inside its caller's transaction."""
    if getattr(task.request, "is_eager", False):
        return
    close_old_connections()


@task_prerun.connect(weak=False, dispatch_uid="cachesafe-task-prerun-connections")
def _before_task(sender: Any = None, **_: Any) -> None:
    _connections_as_a_request(sender)


@task_postrun.connect(weak=False, dispatch_uid="cachesafe-task-postrun-connections")
def _after_task(sender: Any = None, **_: Any) -> None:
    _connections_as_a_request(sender)


@beat_init.connect(weak=False, dispatch_uid="cachesafe-beat-stops-on-sigterm")
def _beat_stops_on_sigterm(sender: Any = None, **_: Any) -> None:
    """Beat's own SIGTERM handler can be lost in its first seconds (workers/beat.py says how)."""
    from .beat import stop_on_sigterm

    stop_on_sigterm(sender)


@worker_ready.connect(weak=False, dispatch_uid="cachesafe-heartbeat-start")
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    from .heartbeat import start

    start(sender)


@worker_shutdown.connect(weak=False, dispatch_uid="cachesafe-heartbeat-stop")
def _stop_heartbeat(**_: Any) -> None:
    from .heartbeat import stop

    stop()


@worker_init.connect(weak=False, dispatch_uid="cachesafe-freeze-before-fork")
def _freeze_before_each_fork(**_: Any) -> None:
    """In a worker's main process: freeze what it holds before each fork of a pool process.
    What it loaded (Django, the tasks, the engine) is shared with the pool processes until
    written to, and a pool process's garbage collections would write to every object they
    scan; frozen, they scan only what the pool process made itself (as gunicorn's master does
    for the web workers: cachesafe/webserver.py). At the fork itself, so it holds for a pool
    process forked again later, and for either prefork pool (Celery sends its own signal
    before a fork only from the one it uses with an event loop)."""
    os.register_at_fork(before=functools.partial(_freeze_in, os.getpid()))


def _freeze_in(main: int) -> None:
    """Collect, then freeze what is left, in the worker's main process only: the hook is
    inherited by the pool processes, whose own objects are theirs to collect. Collected first,
    no garbage of the moment is kept for ever (a frozen object is never collected)."""
    if os.getpid() == main:
        gc.collect()
        gc.freeze()
