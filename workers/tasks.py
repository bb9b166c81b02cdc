"""The workers' own tasks: heartbeats, and keeping probes waiting while the Mac is online."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.utils import timezone

from registry.jobs import single_running
from registry.probes import MAX_WAITING, request_due_probes

from .models import WorkerHeartbeat


@shared_task(name="workers.record_heartbeat", ignore_result=True)
def record_heartbeat(hostname: str, queues: list[str], info: dict[str, Any]) -> None:
    """Store the heartbeat of a worker that has no database access (the Mac probe worker)."""
    WorkerHeartbeat.beat(hostname, queues, info)


@shared_task(name="workers.prune_heartbeats", ignore_result=True)
def prune_heartbeats(days: int = 7) -> int:
    """Forget workers not heard from for `days` days."""
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = WorkerHeartbeat.objects.filter(last_seen__lt=cutoff).delete()
    return deleted


@shared_task(name="workers.request_due_probes")
def request_due_probes_task(limit: int = MAX_WAITING) -> int:
    """Keep a few probes waiting for the Mac worker while it is online."""
    with single_running("request_due_probes", ttl=300) as mine:
        if not mine or not WorkerHeartbeat.objects.probe_worker_online():
            return 0
        return request_due_probes(limit)
