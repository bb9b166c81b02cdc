"""Delivery that loses nothing and sends nothing twice.

An event is claimed once (`UPDATE … WHERE notify_claimed_at IS NULL`); the winner writes one
`Delivery` per matching channel in the same transaction and enqueues their sends after commit.
A send holds a lease, re-reads the row, counts the attempt, sends, and records the outcome: a
duplicate or retried task finds the success recorded and does nothing. The one gap left is
at-least-once: a receiver that got the request before the worker died gets it again, with the
same `X-CacheSafe-Delivery` id to dedupe on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from registry import jobs
from registry.models import ModelEvent

from . import senders
from .models import Channel, Delivery, Digest, SendRecord, SendStatus, Subscription
from .notifications import DIGEST_MAX_EVENTS, EventLine, Notification, sample_event_line
from .signals import send_requested

logger = logging.getLogger(__name__)

#: Longer than a send task's hard time limit, so a live sender never loses its lease.
SEND_LEASE = timedelta(seconds=90)
MAX_ATTEMPTS = 8
#: A pending send with no task in sight (a lost enqueue) is enqueued again after this.
RESEND_AFTER = timedelta(minutes=5)
BUSY_RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Outcome:
    status: str
    retry_in: float | None = None


def backoff(attempts: int) -> float:
    """30 s, 1, 2, 4 … 32 minutes: eight attempts span about an hour."""
    return float(min(30 * 2 ** max(attempts - 1, 0), senders.RETRY_AFTER_MAX))


def enqueue(task_name: str, pk: int) -> None:
    """Ask for an `alerts.tasks` task on `pk` once the transaction commits (`alerts.receivers`
    sends it; the sweeper covers a broker outage)."""
    send_requested.send(sender=Delivery, task_name=task_name, pk=pk)


def claim_event(event_id: int) -> int | None:
    """Fan an event out to its subscribers' channels, once; None if someone else claimed it."""
    now = timezone.now()
    with transaction.atomic():
        won = ModelEvent.objects.filter(pk=event_id, notify_claimed_at__isnull=True).update(
            notify_claimed_at=now
        )
        if not won:
            return None
        event = ModelEvent.objects.select_related("model").get(pk=event_id)
        if event.created_at < now - timedelta(hours=settings.ALERTS_EVENT_MAX_AGE_HOURS):
            # Old news (a backlog from before alerts were set up): nobody wants it now.
            logger.info("event %s is too old to alert about", event_id)
            return 0
        channels = Channel.objects.filter(
            pk__in=Subscription.objects.matching(event).values("channel")
        ).only("pk", "digest")
        created = 0
        for channel in channels:
            delivery, was_created = Delivery.objects.get_or_create(
                event=event,
                channel=channel,
                defaults={"status": SendStatus.DIGEST if channel.digest else SendStatus.PENDING},
            )
            created += was_created
            if was_created and delivery.status == SendStatus.PENDING:
                enqueue("send_delivery", delivery.pk)
    return created


def dispatch_events(limit: int = 200) -> int:
    """Claim up to `limit` unclaimed events (the beat's sweep behind the new-event signal).

    Only recent ones: older events would not be alerted anyway, and `created_at` is indexed.
    """
    recent = timezone.now() - timedelta(hours=settings.ALERTS_EVENT_MAX_AGE_HOURS)
    ids = list(
        ModelEvent.objects.filter(notify_claimed_at__isnull=True, created_at__gte=recent)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    return sum(claim_event(event_id) is not None for event_id in ids)


def resend_stalled(limit: int = 200) -> int:
    """Enqueue again the pending sends whose task may be lost; the lease makes it harmless."""
    cutoff = timezone.now() - RESEND_AFTER
    stalled = Q(status=SendStatus.PENDING) & (
        Q(next_attempt_at__isnull=True, created_at__lt=cutoff) | Q(next_attempt_at__lt=cutoff)
    )
    count = 0
    with transaction.atomic():
        for model, task in ((Delivery, "send_delivery"), (Digest, "send_digest")):
            pks = list(
                model.objects.filter(stalled).order_by("pk").values_list("pk", flat=True)[:limit]
            )
            # Due now: the next sweep waits RESEND_AFTER again, so a long queue is not flooded.
            model.objects.filter(pk__in=pks).update(next_attempt_at=timezone.now())
            for pk in pks:
                enqueue(task, pk)
            count += len(pks)
    return count


def deliver(delivery_id: int) -> Outcome:
    """Send one delivery unless its success is recorded; say whether to retry, and when."""
    delivery = (
        Delivery.objects.select_related("channel", "event__model").filter(pk=delivery_id).first()
    )
    if delivery is None:
        logger.info("delivery %s is gone; nothing to do", delivery_id)
        return Outcome("gone")

    def notification() -> Notification:
        return Notification("alert", delivery.idempotency_key, [EventLine.of(delivery.event)])

    return _attempt(delivery, delivery.channel, f"delivery:{delivery_id}", notification)


def send_digest(digest_id: int) -> Outcome:
    """Send a channel's daily digest unless it is recorded as sent."""
    digest = Digest.objects.select_related("channel").filter(pk=digest_id).first()
    if digest is None:
        return Outcome("gone")

    def notification() -> Notification:
        waiting = digest.deliveries.select_related("event__model").order_by("event__created_at")
        lines = [EventLine.of(d.event) for d in waiting[:DIGEST_MAX_EVENTS]]
        more = max(0, waiting.count() - len(lines))
        return Notification("digest", digest.idempotency_key, lines, more=more)

    outcome = _attempt(digest, digest.channel, f"digest:{digest_id}", notification)
    status = Digest.objects.filter(pk=digest_id).values_list("status", flat=True).first()
    if status in {SendStatus.SENT, SendStatus.FAILED}:
        # The deliveries share the digest's fate; a failed digest says why on each of them.
        error = Digest.objects.filter(pk=digest_id).values_list("last_error", flat=True).first()
        digest.deliveries.exclude(status=status).update(
            status=status,
            sent_at=timezone.now() if status == SendStatus.SENT else None,
            last_error=error or "",
        )
    return outcome


def collect_digests(limit: int = 200) -> int:
    """Start today's digest of each channel with waiting events; return how many started.

    One digest per channel and day: events that arrive after today's went out wait for
    tomorrow's.
    """
    today = timezone.now().date()
    waiting = Delivery.objects.filter(status=SendStatus.DIGEST, digest__isnull=True)
    channel_ids = list(
        waiting.exclude(channel__digests__day=today)
        .order_by("channel_id")
        .values_list("channel_id", flat=True)
        .distinct()[:limit]
    )
    started = 0
    for channel_id in channel_ids:
        with transaction.atomic():
            digest, created = Digest.objects.get_or_create(channel_id=channel_id, day=today)
            if not created:
                continue
            waiting.filter(channel_id=channel_id).update(digest=digest)
            enqueue("send_digest", digest.pk)
            started += 1
    return started


def send_test(channel_id: int) -> Outcome:
    """Send a sample alert now; the result shows as the channel's last success or error."""
    channel = Channel.objects.filter(pk=channel_id).first()
    if channel is None:
        return Outcome("gone")
    notification = Notification("test", f"test-{channel_id}", [sample_event_line()])
    try:
        senders.send(channel, notification)
    except senders.SendFailure as failure:
        channel.record_error(f"test: {failure}")
        return Outcome("failed")
    except Exception as exc:
        channel.record_error(f"test: {unexpected(exc)}")
        return Outcome("failed")
    channel.record_success()
    return Outcome("sent")


def _attempt(
    record: SendRecord, channel: Channel, lease_key: str, build: Callable[[], Notification]
) -> Outcome:
    rows = type(record)._default_manager.filter(pk=record.pk)
    if record.status != SendStatus.PENDING:
        return Outcome(f"{record.status} already")
    if not channel.is_active:
        why = channel.disabled_reason or "the address is not confirmed"
        rows.update(status=SendStatus.FAILED, last_error=f"channel disabled: {why}"[:500])
        return Outcome("channel disabled")
    if not jobs.acquire(lease_key, SEND_LEASE):
        return Outcome("busy", retry_in=BUSY_RETRY_SECONDS)  # a live sender is on it
    try:
        # Counted before sending; re-read under the lease, as a duplicate may just have won.
        if not rows.filter(status=SendStatus.PENDING).update(
            attempts=F("attempts") + 1, last_attempt_at=timezone.now()
        ):
            return Outcome("done already")
        attempts = rows.values_list("attempts", flat=True).get()
        try:
            code = senders.send(channel, build())
        except senders.SendFailure as failure:
            return _record_failure(rows, channel, failure, attempts)
        except Exception as exc:
            # Recorded as a failure like any other, retried with the same backoff up to
            # MAX_ATTEMPTS: unrecorded, the send stayed pending and was sent again for ever.
            return _record_failure(rows, channel, senders.SendFailure(unexpected(exc)), attempts)
        rows.update(
            status=SendStatus.SENT,
            sent_at=timezone.now(),
            response_code=code,
            last_error="",
            next_attempt_at=None,
        )
        channel.record_success()
        return Outcome("sent")
    finally:
        jobs.release(lease_key)


def unexpected(exc: Exception) -> str:
    """A send that failed as no sender expects (a bug, an answer nothing checks yet): logged
    with its traceback, and what the channel's page says."""
    logger.error("a send failed unexpectedly", exc_info=exc)
    return f"could not send ({type(exc).__name__}: {str(exc)[:200]})"


def _record_failure(
    rows: Any, channel: Channel, failure: senders.SendFailure, attempts: int
) -> Outcome:
    error = str(failure)[:500]
    channel.record_error(error)
    if failure.disable:
        channel.disable(error)
    if failure.retry and not failure.disable and attempts < MAX_ATTEMPTS:
        wait = failure.retry_after if failure.retry_after is not None else backoff(attempts)
        rows.update(
            last_error=error,
            response_code=failure.code,
            next_attempt_at=timezone.now() + timedelta(seconds=wait),
        )
        logger.info("send failed (attempt %s), retry in %.0f s: %s", attempts, wait, error)
        return Outcome("retry", retry_in=wait)
    rows.update(
        status=SendStatus.FAILED, last_error=error, response_code=failure.code, next_attempt_at=None
    )
    return Outcome("failed")
