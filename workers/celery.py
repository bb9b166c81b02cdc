"""The Celery app. Postgres holds the state; Celery only executes (tasks take primary keys)."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachesafe.settings")

#: Every queue the project uses. `mlx` is consumed only by the Mac probe worker.
QUEUES = ("default", "hub", "checks", "mlx", "notify")
#: What a main (non-Mac) worker consumes.
MAIN_QUEUES = ("default", "hub", "checks", "notify")

app = Celery("cachesafe")
app.config_from_object("django.conf:settings", namespace="CELERY")


app.conf.update(
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
