"""What happened to a tracked model that subscribers may want to hear about."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone


class EventKind(models.TextChoices):
    TEMPLATE_CHANGED = "template_changed", "Template changed"
    VERDICT_CHANGED = "verdict_changed", "Verdict changed"
    PROBE_CHANGED = "probe_changed", "Probe result changed"
    STATUS_CHANGED = "status_changed", "Repo gated or gone"
    BASE_FIXED = "base_fixed", "Still carries a template its base has fixed"


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
