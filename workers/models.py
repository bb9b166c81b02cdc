"""What the service knows about its own background processes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import models
from django.utils import timezone

#: A worker or beat that has not been heard from for this long is offline.
HEARTBEAT_STALE_AFTER = timedelta(seconds=60)


class WorkerHeartbeatQuerySet(models.QuerySet["WorkerHeartbeat"]):
    def alive(self) -> WorkerHeartbeatQuerySet:
        return self.filter(last_seen__gte=timezone.now() - HEARTBEAT_STALE_AFTER)


class WorkerHeartbeat(models.Model):
    """The last sign of life of one Celery worker, and what it told us about itself."""

    hostname = models.CharField(max_length=255, unique=True)
    queues = models.JSONField(default=list)
    info = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now, db_index=True)

    objects = WorkerHeartbeatQuerySet.as_manager()

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    @property
    def is_alive(self) -> bool:
        return self.last_seen >= timezone.now() - HEARTBEAT_STALE_AFTER

    @property
    def is_probe_worker(self) -> bool:
        return "mlx" in self.queues

    @classmethod
    def beat(cls, hostname: str, queues: list[str], info: dict[str, Any]) -> None:
        now = timezone.now()
        obj, created = cls.objects.get_or_create(
            hostname=hostname,
            defaults={"queues": queues, "info": info, "started_at": now, "last_seen": now},
        )
        if not created:
            cls.objects.filter(pk=obj.pk).update(queues=queues, info=info, last_seen=now)


class BeatTick(models.Model):
    """Singleton row: when the beat scheduler last ran its loop."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_tick = models.DateTimeField()

    def __str__(self) -> str:
        return f"beat at {self.last_tick:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def record(cls) -> None:
        cls.objects.update_or_create(id=1, defaults={"last_tick": timezone.now()})

    @classmethod
    def last(cls) -> BeatTick | None:
        return cls.objects.filter(id=1).first()


class EventKind(models.TextChoices):
    TEMPLATE_CHANGED = "template_changed", "Template changed"
    VERDICT_CHANGED = "verdict_changed", "Verdict changed"
    PROBE_CHANGED = "probe_changed", "Probe result changed"
    STATUS_CHANGED = "status_changed", "Repo gated or gone"


class ModelEvent(models.Model):
    """Something happened to a tracked model that subscribers may want to hear about.

    `key` makes writing an event idempotent: a retried task that records the same event again
    hits the unique constraint instead of creating a duplicate.
    """

    model = models.ForeignKey("registry.HubModel", on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices, db_index=True)
    key = models.CharField(max_length=200, unique=True)
    summary = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    #: Set by the one notify task that won the claim: UPDATE ... WHERE notify_claimed_at IS NULL.
    notify_claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.summary}"

    @classmethod
    def record(
        cls, model_id: int, kind: str, key: str, summary: str, data: dict[str, Any]
    ) -> ModelEvent:
        event, _ = cls.objects.get_or_create(
            key=key, defaults={"model_id": model_id, "kind": kind, "summary": summary, "data": data}
        )
        return event


class Lease(models.Model):
    """Who is working on a job right now (`key`), until when.

    A task claims the lease before acting; a second delivery of the same task finds it held by a
    live worker and waits. A holder that died (SIGKILL, OOM) loses the lease as soon as its death
    is visible (same host, pid gone) or when the lease expires.
    """

    key = models.CharField(max_length=200, unique=True)
    holder = models.CharField(max_length=255)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.key} held by {self.holder}"
