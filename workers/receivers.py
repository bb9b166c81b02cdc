"""Signal receivers that start pipeline work as soon as the registry reports a change."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import receiver

from registry.signals import template_changed

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
