"""Celery tasks. Each names its queue; each takes plain data or primary keys."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from .celery import app
from .models import WorkerHeartbeat


@app.task(name="workers.record_heartbeat", queue_name="default", ignore_result=True)
def record_heartbeat(hostname: str, queues: list[str], info: dict[str, Any]) -> None:
    """Store the heartbeat of a worker that has no database access (the Mac probe worker)."""
    WorkerHeartbeat.beat(hostname, queues, info)


@app.task(name="workers.prune_heartbeats", queue_name="default", ignore_result=True)
def prune_heartbeats(days: int = 7) -> int:
    """Forget workers not heard from for `days` days."""
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = WorkerHeartbeat.objects.filter(last_seen__lt=cutoff).delete()
    return deleted
