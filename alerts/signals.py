"""Alerts go out as soon as an event is written: a new ModelEvent enqueues its claim.

The beat's sweep (`alerts.dispatch_events`) claims whatever this misses (a broker outage, a
crash between commit and enqueue); the claim itself makes the two harmless together.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_save
from django.dispatch import receiver

from registry.models import ModelEvent

from .delivery import enqueue


@receiver(post_save, sender=ModelEvent, dispatch_uid="alerts.event_written")
def _event_written(sender: Any, instance: ModelEvent, created: bool, **kwargs: Any) -> None:
    if created:
        enqueue("claim_event", instance.pk)
