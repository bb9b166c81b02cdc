"""Is the service alive? Database, broker, workers, beat and the Mac probe worker."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, connections
from django.utils import timezone

from .models import HEARTBEAT_STALE_AFTER, BeatTick, WorkerHeartbeat

logger = logging.getLogger(__name__)
BROKER_TIMEOUT = 2
#: The banner on every page reuses a status this young instead of asking again.
CACHE_SECONDS = 10.0


@dataclass(frozen=True)
class Component:
    ok: bool
    detail: str
    since: datetime | None = None


@dataclass(frozen=True)
class ServiceStatus:
    database: Component
    broker: Component
    worker: Component
    beat: Component
    probe_worker: Component
    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """The probe worker lives on another machine; it does not make the service unhealthy."""
        return self.database.ok and self.broker.ok and self.worker.ok and self.beat.ok

    @property
    def problems(self) -> list[str]:
        parts = [self.database, self.broker, self.worker, self.beat]
        return [c.detail for c in parts if not c.ok]

    def as_json(self) -> dict[str, Any]:
        def component(c: Component) -> dict[str, Any]:
            data = asdict(c)
            data["since"] = c.since.isoformat() if c.since else None
            return data

        return {
            "status": "ok" if self.healthy else "degraded",
            "database": component(self.database),
            "broker": component(self.broker),
            "worker": component(self.worker),
            "beat": component(self.beat),
            "probe_worker": component(self.probe_worker),
            "workers": self.workers,
        }


def _database() -> Component:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Component(True, "database reachable")
    except DatabaseError as exc:
        return Component(False, f"database unreachable: {str(exc).strip().splitlines()[0]}")


def _broker() -> Component:
    """Redis answers a PING (deployed), or the embedded broker's folder can be written to: the
    only two brokers the settings make. Asked without Celery, so that a web process, which
    runs this check in the background from its start, does not load Celery for it."""
    url: str = settings.CELERY_BROKER_URL
    try:
        if url.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(
                url, socket_connect_timeout=BROKER_TIMEOUT, socket_timeout=BROKER_TIMEOUT
            )
            try:
                client.ping()
            finally:
                client.close()
        else:
            options: dict[str, Any] = settings.CELERY_BROKER_TRANSPORT_OPTIONS
            folder = Path(str(options["data_folder_in"]))
            if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                raise OSError(f"the broker folder {folder} is missing or not writable")
        return Component(True, "broker reachable")
    except Exception as exc:  # redis-py raises many kinds; any of them means "not reachable"
        return Component(False, f"broker unreachable: {exc}")


def _ago(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M UTC")


def service_status() -> ServiceStatus:
    database = _database()
    broker = _broker()
    if not database.ok:
        unknown = Component(False, "unknown: the database is unreachable")
        return ServiceStatus(database, broker, unknown, unknown, unknown)
    try:
        return _processes(database, broker)
    except DatabaseError as exc:  # a missing table (not migrated), or the database just went
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        database = Component(False, f"database error: {first}")
        unknown = Component(False, "unknown: the database could not be read")
        return ServiceStatus(database, broker, unknown, unknown, unknown)


def _processes(database: Component, broker: Component) -> ServiceStatus:
    beats = list(WorkerHeartbeat.objects.all())
    main = [hb for hb in beats if not hb.is_probe_worker]
    probes = [hb for hb in beats if hb.is_probe_worker]

    def summarize(rows: list[WorkerHeartbeat], label: str) -> Component:
        alive = [hb for hb in rows if hb.is_alive]
        if alive:
            names = ", ".join(hb.hostname for hb in alive)
            return Component(True, f"{label} online: {names}", max(hb.last_seen for hb in alive))
        if rows:
            last = max(hb.last_seen for hb in rows)
            return Component(False, f"{label} offline since {_ago(last)}", last)
        return Component(False, f"{label} has never reported")

    tick = BeatTick.last()
    if tick is None:
        beat = Component(False, "beat scheduler has never ticked")
    elif tick.last_tick >= timezone.now() - HEARTBEAT_STALE_AFTER:
        beat = Component(True, "beat scheduler ticking", tick.last_tick)
    else:
        beat = Component(False, f"beat scheduler silent since {_ago(tick.last_tick)}")

    return ServiceStatus(
        database=database,
        broker=broker,
        worker=summarize(main, "Worker"),
        beat=beat,
        probe_worker=summarize(probes, "Mac probe worker"),
        workers=[
            {
                "hostname": hb.hostname,
                "queues": hb.queues,
                "alive": hb.is_alive,
                "last_seen": hb.last_seen.isoformat(),
                "info": hb.info,
            }
            for hb in beats
        ],
    )


_cache_lock = threading.Lock()
_cached: tuple[float, ServiceStatus] | None = None
_refreshing = False
#: Bumped by `forget_cached_status`: a refresh that started before keeps its answer to itself.
_generation = 0


def forget_cached_status() -> None:
    """Ask afresh on the next page (tests, after changing what the status reads). A refresh
    already under way in a background thread may finish later: its older answer is dropped."""
    global _cached, _generation
    with _cache_lock:
        _cached = None
        _generation += 1


def _refresh() -> ServiceStatus:
    global _cached, _refreshing
    started = _generation
    try:
        status = service_status()
        with _cache_lock:
            if started == _generation:
                _cached = (time.monotonic(), status)
        return status
    finally:
        _refreshing = False


def _refresh_in_background() -> None:
    try:
        _refresh()
    except Exception:  # noqa: BLE001 - the banner keeps its last status; the next page retries
        logger.warning("could not refresh the service status", exc_info=True)
    finally:
        connections.close_all()  # this thread's own connections: none may outlive it


#: The banner's status while a process's first check is under way: nothing known to be wrong,
#: so no banner (`problems` is empty) on the few pages served before the answer.
NOT_YET = ServiceStatus(*(Component(True, "not known yet: the first check is under way"),) * 5)


def refresh_soon() -> None:
    """Start asking in the background now, unless an answer is kept or a check is under way.
    A web worker calls it as it starts (gunicorn's `post_fork`, cachesafe/webserver.py), so
    that its first page finds the answer instead of asking for it: the database and the
    broker, a new connection to each, and with the broker down its whole timeout."""
    global _refreshing
    with _cache_lock:
        if _cached is not None or _refreshing:
            return
        _refreshing = True
    threading.Thread(target=_refresh_in_background, name="health-refresh", daemon=True).start()


def cached_status() -> ServiceStatus:
    """The status for the page banner, asked at most every CACHE_SECONDS per process.

    A stale status is served while a background thread asks again: with the broker down,
    asking takes seconds (its timeout), and no page should wait for that. Before the first
    answer, a page waits for it only when nobody is asking yet (a process that did not call
    `refresh_soon`); while the first check is under way, pages get `NOT_YET`.
    """
    global _refreshing
    with _cache_lock:
        cached = _cached
        if cached and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        if cached is not None:
            if not _refreshing:
                _refreshing = True
                threading.Thread(
                    target=_refresh_in_background, name="health-refresh", daemon=True
                ).start()
            return cached[1]
        if _refreshing:
            return NOT_YET
    return _refresh()
