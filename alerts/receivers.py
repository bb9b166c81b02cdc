"""Where alerts start: a new event enqueues its claim, and the delivery code's requests for a
send become tasks, each after commit.

The beat's sweep (`alerts.dispatch_events`) claims whatever this misses (a broker outage, a
crash between commit and enqueue); the claim itself makes the two harmless together.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_save
from django.dispatch import receiver

from registry.jobs import enqueue_on_commit
from registry.models import ModelEvent
from registry.signals import events_recorded

from .signals import send_requested

#: The tasks `alerts.delivery` asks for by name: one table, checked when a name is unknown.
TASKS: dict[str, str] = {
    "claim_event": "alerts.claim_event",
    "send_delivery": "alerts.send_delivery",
    "send_digest": "alerts.send_digest",
    "send_test": "alerts.send_test",
}


@receiver(post_save, sender=ModelEvent, dispatch_uid="alerts.event_written")
def _event_written(sender: Any, instance: ModelEvent, created: bool, **kwargs: Any) -> None:
    if created:
        enqueue_on_commit(TASKS["claim_event"], instance.pk)


@receiver(events_recorded, dispatch_uid="alerts.events_recorded")
def _events_recorded(sender: Any, **kwargs: Any) -> None:
    """Bulk-written events (no post_save): the dispatcher claims every unclaimed one."""
    enqueue_on_commit("alerts.dispatch_events")


@receiver(send_requested, dispatch_uid="alerts.send_requested")
def _send_requested(sender: Any, task_name: str, pk: int, **kwargs: Any) -> None:
    enqueue_on_commit(TASKS[task_name], pk)
