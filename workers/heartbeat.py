"""Worker heartbeats: each worker says it is alive every few seconds.

Main workers write their row directly. The Mac probe worker has no database access, so it
sends its heartbeat as a task that a main worker records.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
from typing import Any

import celery
from celery import current_app
from django.db import DatabaseError, close_old_connections

from probe.machine import describe_machine

from .models import WorkerHeartbeat

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 15.0
_stop = threading.Event()


def worker_info(queues: list[str]) -> dict[str, Any]:
    """What a worker reports about itself with every heartbeat."""
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "celery": celery.__version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
    }
    if "mlx" in queues:
        info.update(describe_machine())
    return info


def send_heartbeat(hostname: str, queues: list[str], info: dict[str, Any]) -> None:
    if set(queues) <= {"mlx"}:
        # The Mac has no database: a main worker records it (by name: the Mac runs no tasks
        # of the service's own).
        current_app.send_task(
            "workers.record_heartbeat",
            args=[hostname, queues, info],
            expires=HEARTBEAT_INTERVAL * 4,
        )
        return
    close_old_connections()
    WorkerHeartbeat.beat(hostname, queues, info)


def _run(hostname: str, queues: list[str]) -> None:
    info = worker_info(queues)
    while not _stop.is_set():
        try:
            send_heartbeat(hostname, queues, info)
        except (DatabaseError, OSError, celery.exceptions.CeleryError) as exc:
            logger.warning("heartbeat of %s failed: %s", hostname, exc)
        _stop.wait(HEARTBEAT_INTERVAL)


def start(sender: Any) -> None:
    """At a worker's start (`worker_ready`, connected in `workers.celery`): beat every
    `HEARTBEAT_INTERVAL` in a thread of its own."""
    hostname = str(sender.hostname)
    queues = sorted(sender.app.amqp.queues.consume_from.keys())
    _stop.clear()
    threading.Thread(
        target=_run, args=(hostname, queues), name="cachesafe-heartbeat", daemon=True
    ).start()


def stop() -> None:
    _stop.set()
