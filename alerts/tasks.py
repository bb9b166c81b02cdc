"""The alerts' Celery tasks (queue `notify`, by the routing table): fan events out to
subscribers and deliver alerts.

The state lives in Postgres (`alerts.Delivery`, `alerts.Digest`); these tasks take primary
keys and call `alerts.delivery`, which claims, leases and records (docs/alerts.md).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from django.db import InterfaceError, OperationalError

from registry.jobs import single_running

from . import delivery

logger = logging.getLogger(__name__)

#: A lost database connection is worth a retry; the claim and the records keep it harmless.
DB_ERRORS = (OperationalError, InterfaceError)


@shared_task(
    name="alerts.claim_event",
    acks_late=True,
    autoretry_for=DB_ERRORS,
    retry_backoff=2,
    max_retries=10,
    soft_time_limit=60,
    time_limit=75,
)
def claim_event(event_id: int) -> int:
    """Write one delivery per subscribed channel for this event (once, whoever asks)."""
    return delivery.claim_event(event_id) or 0


#: Sends are idempotent (the record says whether it succeeded): acks_late is safe.
SEND_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "autoretry_for": DB_ERRORS,
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "max_retries": 30,
    "soft_time_limit": 40,
    "time_limit": 50,
}


def _finish(task: Task[Any, Any], outcome: delivery.Outcome) -> str:
    if outcome.retry_in is not None:
        # The attempt count in the row bounds the retries, not Celery's counter.
        raise task.retry(countdown=outcome.retry_in, max_retries=None)
    return outcome.status


@shared_task(name="alerts.send_delivery", **SEND_OPTIONS)
def send_delivery(self: Task[Any, Any], delivery_id: int) -> str:
    """Send one alert unless its success is recorded; retries with backoff when transient."""
    return _finish(self, delivery.deliver(delivery_id))


@shared_task(name="alerts.send_digest", **SEND_OPTIONS)
def send_digest(self: Task[Any, Any], digest_id: int) -> str:
    """Send one channel's daily digest unless it is recorded as sent."""
    return _finish(self, delivery.send_digest(digest_id))


@shared_task(name="alerts.send_test", soft_time_limit=40, time_limit=50)
def send_test(channel_id: int) -> str:
    """A test message the owner asked for (not idempotent: no acks_late)."""
    return delivery.send_test(channel_id).status


@shared_task(
    name="alerts.dispatch_events",
    acks_late=True,
    soft_time_limit=240,
    time_limit=270,
)
def dispatch_events(limit: int = 200) -> int:
    """Beat: claim the events the new-event signal missed; re-send lost pending sends."""
    with single_running("alerts.dispatch_events", ttl=300) as mine:
        if not mine:
            return 0
        return delivery.dispatch_events(limit) + delivery.resend_stalled(limit)


@shared_task(
    name="alerts.send_due_digests",
    acks_late=True,
    soft_time_limit=240,
    time_limit=270,
)
def send_due_digests(limit: int = 200) -> int:
    """Beat (hourly): start today's digest of every channel that has events waiting."""
    with single_running("alerts.send_due_digests", ttl=300) as mine:
        return delivery.collect_digests(limit) if mine else 0
