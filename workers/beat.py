"""The beat scheduler: django-celery-beat's, plus a tick record that /healthz reads, and a
SIGTERM that always stops beat."""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType
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


def stop_on_sigterm(service: Any) -> None:
    """Replace Celery's SIGTERM/SIGINT handler in beat with one that always stops it.

    Celery's handler saves the schedule, then raises SystemExit. When the signal lands while
    beat is still building its scheduler (its first seconds), saving builds a second one inside
    the handler; that can fail with a database error, which the handler then raises instead of
    SystemExit, into whatever beat was doing. django-celery-beat catches database errors there,
    so beat carried on as if nothing had been asked: `manage.py serve`, killed, left a beat
    running for good (its children get one SIGTERM when it dies). Here the schedule is saved
    only if the scheduler exists, a failure to save is logged, and SystemExit is raised
    whatever happened.
    """

    def stop(signum: int, frame: FrameType | None) -> None:
        try:
            if "scheduler" in vars(service):  # built (a cached property): save what it holds
                service.sync()
        except Exception:
            logger.exception("beat could not save its schedule while stopping")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
