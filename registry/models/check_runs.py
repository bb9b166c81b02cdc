"""What the engine said about a template version, and the catalog's copy of it per model."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .catalog import HubModel, TemplateVersion, Verdict


class CheckStatus(models.TextChoices):
    PENDING = "pending", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class CheckRun(models.Model):
    """The engine's report on one template version, for one engine version (and tokenizer)."""

    template_version = models.ForeignKey(
        TemplateVersion, on_delete=models.CASCADE, related_name="check_runs"
    )
    engine_version = models.CharField(max_length=40)
    tokenizer_sha = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=CheckStatus.choices, default=CheckStatus.PENDING, db_index=True
    )
    verdict = models.CharField(max_length=32, choices=Verdict.choices, default=Verdict.PENDING)
    summary = models.TextField(blank=True)
    report = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    progress = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["template_version", "engine_version", "tokenizer_sha"],
                name="one_check_per_engine_version",
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"check {self.template_version} ({self.engine_version}): {self.verdict}"


class Thinking(models.TextChoices):
    """How the template's thinking switch (enable_thinking) relates to the cache."""

    NONE = "none", "No thinking switch"
    SAME = "same", "Same verdict either way"
    DIFFERS = "differs", "Depends on thinking"


class Tools(models.TextChoices):
    """How the tool-calling sessions fare under the template's default setting."""

    SAFE = "safe", "Tools keep the cache"
    UNSAFE = "unsafe", "Tools break the cache"
    UNSUPPORTED = "unsupported", "No tool support"
    UNKNOWN = "unknown", "Not checked"


class ProbeStatus(models.TextChoices):
    """The verdict of the model's latest finished mlx-lm probe (`ProbeVerdict`)."""

    NONE = "none", "No probe yet"
    HIT = "hit", "Probe: cache reused"
    PARTIAL = "partial", "Probe: partly reused"
    MISS = "miss", "Probe: cache lost"
    WRONG = "wrong", "Probe: wrong output from cache"


class CatalogVerdict(models.Model):
    """Per-variant verdicts of a model's current template, denormalized for the catalog.

    Written only by `registry.verdicts.refresh_verdicts` (and the probe column by
    `registry.verdicts.record_probe`), in the transaction that changes what they copy. The
    reuse figure is the model's own (`HubModel.reuse`), written with the row.
    """

    model = models.OneToOneField(
        HubModel, on_delete=models.CASCADE, primary_key=True, related_name="catalog_verdict"
    )
    thinking = models.CharField(
        max_length=16, choices=Thinking.choices, default=Thinking.NONE, db_index=True
    )
    #: Verdict with enable_thinking=false / true ("" when the template has no switch).
    thinking_off = models.CharField(max_length=32, choices=Verdict.choices, blank=True)
    thinking_on = models.CharField(max_length=32, choices=Verdict.choices, blank=True)
    tools = models.CharField(
        max_length=16, choices=Tools.choices, default=Tools.UNKNOWN, db_index=True
    )
    probe = models.CharField(
        max_length=16, choices=ProbeStatus.choices, default=ProbeStatus.NONE, db_index=True
    )
    #: [{"key", "label", "verdict", "share"}] for each variant, in the engine's order.
    variants = models.JSONField(default=list, blank=True)
    #: {thinking: {client: {engine: verdict}}}: the verdict for each reader's setup.
    setups = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.model_id}: thinking {self.thinking}, tools {self.tools}"

    @property
    def thinking_badges(self) -> list[tuple[str, str]]:
        return thinking_badges(self.thinking, self.thinking_off, self.thinking_on)


def thinking_badges(thinking: str, off: str, on: str) -> list[tuple[str, str]]:
    """(label, verdict) per thinking setting, only when the settings disagree."""
    if thinking != Thinking.DIFFERS:
        return []
    return [("thinking off", off), ("thinking on", on)]
