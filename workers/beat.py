"""The beat scheduler: django-celery-beat's, plus a tick record that /healthz reads."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import DatabaseError
from django_celery_beat.schedulers import DatabaseScheduler

from .models import BeatTick

logger = logging.getLogger(__name__)

TICK_RECORD_INTERVAL = 10.0


class RecordingDatabaseScheduler(DatabaseScheduler):  # type: ignore[misc]
    """Schedules from the database (editable in the admin) and records each loop."""

    _last_recorded = 0.0

    def tick(self, *args: Any, **kwargs: Any) -> float:
        now = time.monotonic()
        if now - self._last_recorded >= TICK_RECORD_INTERVAL:
            try:
                BeatTick.record()
                self._last_recorded = now
            except DatabaseError as exc:
                logger.warning("could not record the beat tick: %s", exc)
        interval: float = super().tick(*args, **kwargs)
        # Wake up often enough that the tick record stays fresh.
        return min(interval, TICK_RECORD_INTERVAL)
