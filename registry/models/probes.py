"""mlx-lm cache-reuse probes of a model, run on the Mac worker and stored here."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


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
