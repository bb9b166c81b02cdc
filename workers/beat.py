"""The beat scheduler: the schedule is a table (`PeriodicJob`, edited in the admin), each loop
is recorded for /healthz, and a SIGTERM always stops beat.

Our own, not django-celery-beat's: that library's models and admin import Celery, so with it
installed every web process loaded Celery, kombu and their dependencies (about 11 MiB a web
worker, docs/dashboard.md) only to show the schedule in the admin. This schedule needs a
fraction of what the library offers (a task by name, an interval, keyword arguments, on or
off), and Celery's own `Scheduler` does the timing: this class only reads the table, notices
edits, and writes back when each job last ran, so that a restarted beat does not run every job
at once.
"""

from __future__ import annotations

import logging
import signal
import time
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule as every
from django.db import DatabaseError, close_old_connections, connection

from .models import BeatTick, PeriodicJob

logger = logging.getLogger(__name__)

TICK_RECORD_INTERVAL = 10.0
#: How often beat asks whether the table changed (one query: each row's id and edit time).
RELOAD_CHECK_SECONDS = 5.0


class TableScheduler(Scheduler):
    """Celery's scheduler over the `PeriodicJob` table: enabled rows are the schedule; an edit
    (a row added, changed or deleted) is read within `RELOAD_CHECK_SECONDS`; when each job last
    ran is written back every `sync_every` seconds and when beat stops."""

    #: Seconds between writes of the run times (Celery's default is three minutes).
    sync_every = 10

    _last_recorded = 0.0
    _last_checked = 0.0
    _version: frozenset[tuple[int, datetime]] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ran: set[str] = set()
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        self._load()

    def _load(self) -> None:
        version = PeriodicJob.objects.version()
        entries: dict[str, ScheduleEntry] = {}
        for job in PeriodicJob.objects.filter(enabled=True):
            entries[job.name] = self.Entry(
                name=job.name,
                task=job.task,
                # Never run: due one interval after it was written, as a new row of
                # django-celery-beat was (a fresh install does not run every job at once).
                last_run_at=job.last_run_at or job.edited_at,
                total_run_count=job.total_run_count,
                # At least a second, whatever a write that skipped validation left.
                schedule=every(timedelta(seconds=max(1, job.every_seconds)), app=self.app),
                kwargs=job.kwargs if isinstance(job.kwargs, dict) else {},
                app=self.app,
            )
        self.data = entries
        self._version = version
        self._last_checked = time.monotonic()
        logger.info("beat: %d scheduled jobs", len(entries))

    def _reload_if_edited(self) -> None:
        now = time.monotonic()
        if now - self._last_checked < RELOAD_CHECK_SECONDS:
            return
        self._last_checked = now
        try:
            if not connection.in_atomic_block:
                close_old_connections()  # as a request would: a broken connection is replaced
            if PeriodicJob.objects.version() != self._version:
                self.sync()
                self._load()
        except DatabaseError as exc:
            logger.warning("beat: could not read the schedule, keeping the last one: %s", exc)

    def reserve(self, entry: ScheduleEntry) -> Any:
        new_entry = super().reserve(entry)
        self._ran.add(str(entry.name))
        return new_entry

    def sync(self) -> None:
        """Write back when each job that ran since the last sync last ran."""
        ran, self._ran = self._ran, set()
        try:
            for name in ran:
                entry = self.data.get(name)
                if entry is not None:
                    PeriodicJob.objects.filter(name=name).update(
                        last_run_at=entry.last_run_at, total_run_count=entry.total_run_count
                    )
        except DatabaseError as exc:
            self._ran |= ran  # tried again at the next sync
            logger.warning("beat: could not record when jobs ran: %s", exc)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        # Edits are read here, before Celery's tick compares the schedule with the one its
        # queue was built from, and never in the middle of it: a reload between its read of the
        # schedule and `reserve` would put back a job just turned off.
        if self._version is not None:
            self._reload_if_edited()
        now = time.monotonic()
        if now - self._last_recorded >= TICK_RECORD_INTERVAL:
            try:
                BeatTick.record()
                self._last_recorded = now
            except DatabaseError as exc:
                logger.warning("could not record the beat tick: %s", exc)
        interval: float = super().tick(*args, **kwargs)
        # Wake up often enough that the tick record stays fresh, and when the next look at the
        # table is due: sleeping a full RELOAD_CHECK_SECONDS could wake just before it, and
        # read an edit only a second interval later.
        next_check = RELOAD_CHECK_SECONDS - (time.monotonic() - self._last_checked)
        return max(0.0, min(interval, TICK_RECORD_INTERVAL, next_check))

    @property
    def info(self) -> str:
        return f"    . schedule -> the PeriodicJob table, read every {RELOAD_CHECK_SECONDS:g} s"


def stop_on_sigterm(service: Any) -> None:
    """Replace Celery's SIGTERM/SIGINT handler in beat with one that always stops it.

    Celery's handler saves the schedule, then raises SystemExit. When the signal lands while
    beat is still building its scheduler (its first seconds), saving builds a second one inside
    the handler; that can fail with a database error, which the handler then raises instead of
    SystemExit, into whatever beat was doing. django-celery-beat (the scheduler before this
    one) caught database errors there, so beat carried on as if nothing had been asked:
    `manage.py serve`, killed, left a beat running for good (its children get one SIGTERM when
    it dies). Here the schedule is saved only if the scheduler exists, a failure to save is
    logged, and SystemExit is raised whatever happened.
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
