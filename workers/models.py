"""What the service knows about its own background processes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
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


class PeriodicJobQuerySet(models.QuerySet["PeriodicJob"]):
    def version(self) -> frozenset[tuple[int, datetime]]:
        """What changes whenever a row is added, edited or deleted: beat reloads on a change.
        Every row's edit time, not only the latest: an edit stamped earlier than another (a
        web host whose clock is behind) is still a change."""
        return frozenset(self.values_list("id", "edited_at"))


class PeriodicJob(models.Model):
    """One entry of beat's schedule: a task sent by name every `every_seconds`.

    The defaults are written once (`workers.schedule`); staff edit them in the admin, and beat
    (`workers.beat.TableScheduler`) reads the change within seconds.
    """

    name = models.CharField(max_length=200, unique=True)
    task = models.CharField(max_length=200, help_text="The task's name, as the workers know it.")
    every_seconds = models.PositiveIntegerField(
        "every (seconds)", validators=[MinValueValidator(1)]
    )
    kwargs = models.JSONField(
        default=dict, blank=True, help_text="Keyword arguments, a JSON object."
    )
    enabled = models.BooleanField(default=True)
    last_run_at = models.DateTimeField(null=True, blank=True, editable=False)
    total_run_count = models.PositiveIntegerField(default=0, editable=False)
    #: Set by every save (the admin's); beat's own writes (`update`) leave it alone.
    edited_at = models.DateTimeField(auto_now=True)

    objects = PeriodicJobQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(every_seconds__gte=1), name="periodicjob_every_second_or_more"
            )
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not isinstance(self.kwargs, dict):
            raise ValidationError({"kwargs": "Keyword arguments must be a JSON object."})
