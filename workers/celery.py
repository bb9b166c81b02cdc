"""The Celery app. Postgres holds the state; Celery only executes (tasks take primary keys)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachesafe.settings")

#: Every queue the project uses. `mlx` is consumed only by the Mac probe worker.
QUEUES = ("default", "hub", "checks", "mlx", "notify")
#: What a main (non-Mac) worker consumes.
MAIN_QUEUES = ("default", "hub", "checks", "notify")

app = Celery(
    "cachesafe",
    include=[
        "workers.tasks",
        "workers.checking",
        "workers.hub",
        "workers.notify",
        "workers.probing",
    ],
)
app.config_from_object("django.conf:settings", namespace="CELERY")


def route_by_task(
    name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any
) -> Any:
    """Every task names its queue (`queue_name=` on the decorator); this sends it there."""
    queue = getattr(task, "queue_name", None)
    return {"queue": queue} if queue else None


app.conf.update(
    task_routes=(route_by_task,),
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
