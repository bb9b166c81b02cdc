"""Tasks waiting to be sent: the transactional outbox of `registry.jobs.enqueue_on_commit`."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class OutboxMessage(models.Model):
    """A task to send, written in the transaction that asked for it.

    Deleted once the broker took the message; a row that stays (the broker was down, or the
    process died between commit and send) is sent again by the `workers.flush_outbox` beat job.
    """

    task = models.CharField(max_length=200)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task}{tuple(self.args)}"
