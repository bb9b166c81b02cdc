"""Signal receivers that start pipeline work as soon as the registry reports a change."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import receiver
from django.utils import timezone

from registry.models import EventKind, HubModel, ModelEvent
from registry.signals import status_changed, template_changed

logger = logging.getLogger(__name__)


@receiver(template_changed)
def _check_changed_template(sender: Any, change_id: int, **kwargs: Any) -> None:
    # Sent after the sync's commit. If the broker is down the change stays unclaimed in
    # Postgres and the beat dispatcher picks it up.
    from .checking import handle_template_change

    try:
        handle_template_change.apply_async((change_id,), queue="default")
    except Exception as exc:  # kombu raises many kinds
        logger.warning("could not enqueue template change %s (beat will): %s", change_id, exc)


@receiver(status_changed)
def _record_status_change(
    sender: Any, model_pk: int, old: str, new: str, reason: str, **kwargs: Any
) -> None:
    """A repo became gated, private, missing or disabled: an event subscribers can hear about."""
    repo_id = HubModel.objects.filter(pk=model_pk).values_list("repo_id", flat=True).first()
    ModelEvent.record(
        model_pk,
        EventKind.STATUS_CHANGED,
        key=f"status:{model_pk}:{old}:{new}:{timezone.now():%Y%m%d%H%M%S%f}",
        summary=f"{repo_id}: {old} → {new}" + (f" ({reason})" if reason else ""),
        data={"old": old, "new": new, "reason": reason},
    )
    announce_events()


def announce_events() -> None:
    """Ask the notify side to fan out new events once they are committed (beat sweeps anyway)."""

    def send() -> None:
        from .celery import app

        try:
            app.send_task("alerts.dispatch_events", queue="notify")
        except Exception as exc:  # kombu raises many kinds; the beat sweep picks them up
            logger.warning("could not announce new events: %s", exc)

    transaction.on_commit(send)
