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

    def probe_worker_online(self) -> bool:
        """A live worker consumes the `mlx` queue (the Mac probe worker)."""
        # In Python, not `queues__contains`: SQLite (the embedded default) has no JSON
        # containment, and there are only a few live workers.
        return any(hb.is_probe_worker for hb in self.alive().only("queues"))


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
