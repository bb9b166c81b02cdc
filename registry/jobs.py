"""How background work runs once: leases in the database, single-running locks in the shared
cache, and the one way a task is enqueued.

Every task is sent through `enqueue_on_commit`, which is a transactional outbox: the message is
written as a row in the caller's transaction and sent after commit; the row is deleted once the
broker took it. A broker outage (or a crash between commit and send) leaves the row, and
`flush_outbox` sends it when the broker is back: nothing asked for is lost, and no caller sees a
broker error. Celery's routing table (`workers.celery`) picks the queue from the task's name,
so no call site names a queue.
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from .models import Lease, OutboxMessage

logger = logging.getLogger(__name__)


#: Rows flushed per beat run; older first.
FLUSH_BATCH = 500
#: After a send failed, this process leaves new messages in the outbox for this long without
#: trying the broker: a refused connection still costs seconds, and only the first request of
#: an outage should pay them.
BROKER_BACKOFF_SECONDS = 30.0
_broker_down_until = 0.0


def _send(task: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, outbox_id: int) -> None:
    global _broker_down_until
    if time.monotonic() < _broker_down_until:
        return  # the broker failed a moment ago: flush_outbox sends this one
    try:
        # One attempt: the outbox is the retry, and a request must not wait out kombu's
        # publish retries while the broker is down.
        task_named(task).apply_async(args, kwargs, retry=False)
    except Exception as exc:  # kombu raises many kinds; the row stays for flush_outbox
        logger.warning("could not enqueue %s%r (kept in the outbox): %s", task, args, exc)
        _broker_down_until = time.monotonic() + BROKER_BACKOFF_SECONDS
        _note_failure(outbox_id, exc)
        return
    # The row by its key: one DELETE. A queryset's delete() wraps it in a transaction of its
    # own (BEGIN, DELETE, COMMIT), after every commit that asked for work.
    OutboxMessage(pk=outbox_id).delete()


#: Returns the configured Celery app. Given by the workers app when Django starts
#: (`use_celery_app`), and called on a process's first send: a process that sends nothing (a
#: web worker serving pages) never imports Celery.
_celery_app: Callable[[], Any] | None = None


def use_celery_app(loader: Callable[[], Any]) -> None:
    global _celery_app
    _celery_app = loader


def celery_app() -> Any:
    """The configured Celery app; Celery's current app where none was given (a process that
    started from the app itself, as a worker does)."""
    if _celery_app is not None:
        return _celery_app()
    from celery import current_app

    return current_app


def task_named(name: str) -> Any:
    """The registered task called `name`. A process that has not imported the tasks' modules (a
    web worker never needs them to start) imports them now, once: the app's `imports`, and only
    those (the loader's `import_default_modules` would also run Django's system checks, a
    second of a web request's time)."""
    app = celery_app()
    if name not in app.tasks:
        for module in app.conf.imports:
            importlib.import_module(module)
    return app.tasks[name]


def _note_failure(outbox_id: int, exc: Exception) -> None:
    OutboxMessage.objects.filter(pk=outbox_id).update(
        attempts=F("attempts") + 1, last_error=f"{type(exc).__name__}: {exc}"[:500]
    )


def enqueue_on_commit(task: str, *args: Any, **kwargs: Any) -> None:
    """Send the task named `task` with `(*args, **kwargs)` once the current transaction commits
    (at once outside one); kept in the outbox until the broker takes it. Arguments must be JSON
    values.

    By name, as the outbox keeps it: a process that only asks for work (a web worker) never
    imports the tasks' modules, and with them the Hub client, the probe and the engine."""
    row = OutboxMessage.objects.create(task=task, args=list(args), kwargs=kwargs)
    transaction.on_commit(partial(_send, task, args, kwargs, outbox_id=row.pk))


def flush_outbox(
    send: Callable[..., Any], *, limit: int = FLUSH_BATCH, older_than: float = 10.0
) -> int:
    """Send the rows the after-commit send did not get out (`send(name, args, kwargs)`, by
    name: the row keeps only the name); return how many went. Stops at the first failure: the
    broker is still down, the rest waits for the next run."""
    cutoff = timezone.now() - timedelta(seconds=older_than)
    sent = 0
    for row in OutboxMessage.objects.filter(created_at__lt=cutoff).order_by("pk")[:limit]:
        try:
            send(row.task, args=row.args, kwargs=row.kwargs)
        except Exception as exc:  # kombu raises many kinds
            logger.warning("outbox: the broker still refuses %s: %s", row.task, exc)
            _note_failure(row.pk, exc)
            break
        row.delete()
        sent += 1
    return sent


def current_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_is_dead(holder: str) -> bool:
    """True only when the holder ran on this host and its process is gone."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def acquire(key: str, ttl: timedelta) -> bool:
    """Claim the lease `key` for `ttl`; True if this process now holds it."""
    me = current_holder()
    now = timezone.now()
    try:
        with transaction.atomic():
            Lease.objects.create(key=key, holder=me, expires_at=now + ttl)
        return True
    except IntegrityError:
        pass
    lease = Lease.objects.filter(key=key).first()
    if lease is None:
        return acquire(key, ttl)
    if lease.holder == me:
        return True
    if lease.expires_at >= now and not holder_is_dead(lease.holder):
        return False
    # Compare-and-swap: of several processes taking over a dead lease, one wins.
    return (
        Lease.objects.filter(pk=lease.pk, holder=lease.holder, expires_at=lease.expires_at).update(
            holder=me, expires_at=now + ttl
        )
        == 1
    )


def release(key: str) -> None:
    Lease.objects.filter(key=key, holder=current_holder()).delete()


@contextmanager
def single_running(name: str, *, ttl: int) -> Iterator[bool]:
    """Yield True if this caller holds the lock `name`, False if someone else does.

    A lock in the shared cache (Redis in production, the database otherwise). `ttl` bounds how
    long a crashed holder can block others; it must exceed the job's hard limit.
    """
    key = f"lock:{name}"
    token = secrets.token_hex(8)
    acquired = bool(cache.add(key, token, timeout=ttl))
    try:
        yield acquired
    finally:
        # Release only our own lock: after a ttl expiry someone else may hold it now.
        if acquired and cache.get(key) == token:
            cache.delete(key)
