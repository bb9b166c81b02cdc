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


class ProbeVerdict(models.TextChoices):
    """What mlx-lm actually reused, worst over the probe's conversations."""

    HIT = "hit", "Cache reused"
    PARTIAL = "partial", "Partly reused"
    MISS = "miss", "Cache lost"
    WRONG = "wrong", "Wrong output from cache"


#: Worst last: a restored cache that changes the output is worse than a miss.
PROBE_SEVERITY = {ProbeVerdict.HIT: 0, ProbeVerdict.PARTIAL: 1, ProbeVerdict.MISS: 2,
                  ProbeVerdict.WRONG: 3}  # fmt: skip


class ProbeState(models.TextChoices):
    QUEUED = "queued", "Waiting for the Mac worker"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    ERROR = "error", "Failed"


class ProbeRunQuerySet(models.QuerySet["ProbeRun"]):
    def waiting(self) -> ProbeRunQuerySet:
        return self.filter(state__in=[ProbeState.QUEUED, ProbeState.RUNNING])


class ProbeRun(models.Model):
    """One mlx-lm cache-reuse probe of one model at one commit, run on the Mac worker."""

    model = models.ForeignKey(
        "registry.HubModel", on_delete=models.CASCADE, related_name="probe_runs"
    )
    commit_sha = models.CharField(max_length=40, blank=True)
    quantization = models.CharField(max_length=100, blank=True)
    state = models.CharField(
        max_length=16, choices=ProbeState.choices, default=ProbeState.QUEUED, db_index=True
    )
    verdict = models.CharField(max_length=16, choices=ProbeVerdict.choices, blank=True)
    #: Lowest share of the next prompt that the cache reused, over conversations.
    reused_share = models.FloatField(null=True, blank=True)
    #: The engine lost what the template check says is reusable (or the reverse).
    disagreement = models.BooleanField(default=False)
    worker = models.CharField(max_length=255, blank=True)
    machine = models.JSONField(default=dict, blank=True)
    report = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    queued_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = ProbeRunQuerySet.as_manager()

    class Meta:
        ordering = ["-queued_at", "-id"]

    def __str__(self) -> str:
        return f"probe of {self.model_id}@{self.commit_sha[:8]}: {self.state} {self.verdict}"
