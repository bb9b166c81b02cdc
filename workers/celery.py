"""The Celery app. Postgres holds the state; Celery only executes (tasks take primary keys).

Each app keeps its tasks in its own `tasks.py` (`shared_task`); this module finds them and routes
every task, by name, to its queue: one table, used for `delay`, `apply_async` and `send_task`
alike, so no call site names a queue.
"""

from __future__ import annotations

import os

from celery import Celery
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
