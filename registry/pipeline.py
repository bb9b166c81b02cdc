"""The check pipeline's state changes. Postgres holds the state; the Celery tasks call these, and
these ask for work through signals (`check_requested`), never by importing the tasks.

A template change claims itself once, records an event and asks for a check of the new version.
A check runs once per (template sha256, engine version), however many models share the template;
its result updates every model that uses the version and records an event when a verdict flips.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from checks import ENGINE_VERSION, TemplateReport

from .jobs import holder_is_dead
from .models import (
    CheckRun,
    CheckStatus,
    EventKind,
    HubModel,
    Lease,
    ModelEvent,
    NamedTemplate,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
)
from .signals import check_requested, events_recorded
from .storable import storable
from .verdicts import refresh_verdicts, save_run

logger = logging.getLogger(__name__)

#: A pending run whose message was lost (broker down, worker gone) is sent again after this.
RESEND_PENDING_AFTER = timedelta(minutes=2)
#: A running run with no live lease (its holder gone) is sent again once it started this long ago.
RESEND_UNLEASED_AFTER = timedelta(seconds=30)


def send_check(run_id: int) -> None:
    """Ask for the engine on a pending run (sent after commit; the sweeper re-sends a lost one)."""
    check_requested.send(sender=CheckRun, run_id=run_id)


def request_check(
    version: TemplateVersion, *, force: bool = False, tokenizer_sha: str = ""
) -> CheckRun:
    """Make sure the current engine checks `version` (with that tokenizer.json, when one is
    named); enqueue only when there is work to do."""
    run, created = CheckRun.objects.get_or_create(
        template_version=version, engine_version=ENGINE_VERSION, tokenizer_sha=tokenizer_sha
    )
    if created:
        send_check(run.pk)
    elif force:
        CheckRun.objects.filter(pk=run.pk).update(
            status=CheckStatus.PENDING, progress=0, created_at=timezone.now()
        )
        send_check(run.pk)
    return run


def claim_template_changes(*, ids: Iterable[int] | None = None, limit: int = 500) -> int:
    """Act on unclaimed template changes exactly once: an event each, a check per new version.

    Claimed in one transaction with SKIP LOCKED, so concurrent dispatchers (two beat ticks, a
    signal and a tick) split the work instead of doing it twice. Returns how many it claimed.
    """
    with transaction.atomic():
        pending = TemplateChange.objects.filter(checks_claimed_at__isnull=True)
        if ids is not None:
            pending = pending.filter(pk__in=list(ids))
        claimed = list(
            pending.select_for_update(skip_locked=True)
            .order_by("pk")
            .values_list("pk", flat=True)[:limit]
        )
        if not claimed:
            return 0
        TemplateChange.objects.filter(pk__in=claimed).update(checks_claimed_at=timezone.now())
        changes = list(
            TemplateChange.objects.filter(pk__in=claimed).select_related(
                "model", "old_version", "new_version", "snapshot", "model__current_snapshot"
            )
        )
        # A change the history backfill found is old news: checked, not announced.
        ModelEvent.objects.bulk_create(
            [_template_event(change) for change in changes if not change.backfilled],
            ignore_conflicts=True,
        )
        events_recorded.send(sender=ModelEvent)
        wanted = {
            (c.new_version_id, _tokenizer_of(c)): c.model_id
            for c in changes
            if c.new_version_id is not None
        }
        runs = request_checks(wanted)
        done = {(r.template_version_id, r.tokenizer_sha) for r in runs if r.status == "done"}
        if done:
            # Already checked (a template shared with other models): the verdict applies now.
            refresh_verdicts(
                {v for v, _ in done},
                model_ids=[c.model_id for c in changes if (c.new_version_id, _tokenizer_of(c))
                           in done],
            )  # fmt: skip
    return len(claimed)


def _tokenizer_of(change: TemplateChange) -> str:
    """The tokenizer.json the change's snapshot points to ("" for none: bytes only)."""
    snapshot = change.snapshot or change.model.current_snapshot
    return snapshot.tokenizer_json_sha if snapshot else ""


def _template_event(change: TemplateChange) -> ModelEvent:
    old = change.old_version.sha256 if change.old_version else None
    new = change.new_version.sha256 if change.new_version else None
    return ModelEvent(
        model_id=change.model_id,
        kind=EventKind.TEMPLATE_CHANGED,
        key=f"template:{change.pk}",
        summary=f"{change.model.repo_id}: chat template added ({new[:12]})"
        if old is None and new is not None
        else f"{change.model.repo_id}: chat template changed "
        f"({old[:12] if old else 'none'} → {new[:12] if new else 'none'})",
        data={
            "change_id": change.pk,
            "commit": change.commit_sha,
            "title": change.title,
            "old_sha256": old,
            "new_sha256": new,
        },
    )


def request_checks(pairs: Iterable[tuple[int, str]]) -> list[CheckRun]:
    """`request_check` for many (version id, tokenizer sha) pairs: one insert, one send each."""
    wanted = set(pairs)
    if not wanted:
        return []
    ids = {v for v, _ in wanted}
    existing = CheckRun.objects.filter(
        template_version__in=ids,
        engine_version=ENGINE_VERSION,
        tokenizer_sha__in={t for _, t in wanted},
    )
    have = set(existing.values_list("template_version_id", "tokenizer_sha"))
    CheckRun.objects.bulk_create(
        [
            CheckRun(template_version_id=v, engine_version=ENGINE_VERSION, tokenizer_sha=t)
            for v, t in sorted(wanted - have)
        ],
        ignore_conflicts=True,
    )
    runs = [r for r in existing.all() if (r.template_version_id, r.tokenizer_sha) in wanted]
    for run in runs:
        if (run.template_version_id, run.tokenizer_sha) not in have:
            send_check(run.pk)
    return runs


def claim_template_change(change_id: int) -> bool:
    """Act on one template change (the registry's signal): True if this call claimed it."""
    return claim_template_changes(ids=[change_id], limit=1) == 1


def dispatch_template_changes(limit: int = 500) -> int:
    """Claim up to `limit` unclaimed template changes; return how many this call handled."""
    return claim_template_changes(limit=limit)


def pairs_in_use() -> set[tuple[int, str]]:
    """(template version, tokenizer sha) of every current snapshot, default and named."""
    current = HubModel.objects.exclude(current_snapshot=None).values("current_snapshot")
    snapshots = TemplateSnapshot.objects.filter(pk__in=current)
    pairs = set(snapshots.values_list("default_template_id", "tokenizer_json_sha"))
    pairs |= set(
        NamedTemplate.objects.filter(snapshot__in=snapshots).values_list(
            "version_id", "snapshot__tokenizer_json_sha"
        )
    )
    return pairs


def request_missing_checks(limit: int = 500) -> int:
    """Ask for checks of what is in use that this engine version has not checked yet."""
    checked = set(
        CheckRun.objects.filter(engine_version=ENGINE_VERSION).values_list(
            "template_version_id", "tokenizer_sha"
        )
    )
    missing = sorted(pairs_in_use() - checked)[:limit]
    with transaction.atomic():
        request_checks(missing)
    return len(missing)


def resend_stalled_checks(limit: int = 500) -> int:
    """Re-send pending runs whose message may be lost and running ones whose worker is gone;
    leases make a duplicate harmless."""
    now = timezone.now()
    cutoff = now - RESEND_PENDING_AFTER
    stalled = set(
        CheckRun.objects.filter(
            Q(status=CheckStatus.PENDING, created_at__lt=cutoff)
            | Q(status=CheckStatus.RUNNING, started_at__lt=cutoff - RESEND_PENDING_AFTER)
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
    running = dict(
        CheckRun.objects.filter(status=CheckStatus.RUNNING)
        .exclude(pk__in=stalled)
        .values_list("pk", "started_at")
    )
    leases = {
        lease.key: lease
        for lease in Lease.objects.filter(key__in=[f"check:{pk}" for pk in running])
    }
    for run_id, started_at in running.items():
        lease = leases.get(f"check:{run_id}")
        if lease is not None and lease.expires_at >= now:
            # A killed worker never releases its lease: waiting for it to expire loses minutes.
            orphaned = holder_is_dead(lease.holder)
        else:
            # No live lease: a retry between deliveries (lease released) looks the same for a
            # while, so wait a little before sending a duplicate it does not need.
            orphaned = started_at is None or started_at < now - RESEND_UNLEASED_AFTER
        if orphaned:
            stalled.add(run_id)
    resend = sorted(stalled)[:limit]
    with transaction.atomic():
        for run_id in resend:
            send_check(run_id)
    return len(resend)


def store_result(run_id: int, report: dict[str, Any]) -> list[int]:
    """Save a finished check and update every model using the version; return the flipped ones.
    The report's text is stored as the database holds it (`storable`: a template can write a
    lone surrogate into an error message)."""
    with transaction.atomic():
        run = CheckRun.objects.select_for_update().select_related("template_version").get(pk=run_id)
        parsed = TemplateReport.from_dict(storable(report))
        if parsed.engine_version != run.engine_version:
            raise ValueError(f"report of engine {parsed.engine_version} for run {run.pk}")
        save_run(run.template_version, parsed, tokenizer_sha=run.tokenizer_sha)
        return refresh_verdicts([run.template_version_id])


def record_failure(run_id: int, reason: str) -> None:
    """A check that could not finish as no check should (a bug, the task's time limit): the
    run ends `failed` with the reason, which its pages show, instead of staying `running` and
    being sent again for ever. A later check of the version (staff, a new engine) runs anew."""
    CheckRun.objects.filter(pk=run_id).exclude(status=CheckStatus.DONE).update(
        status=CheckStatus.FAILED, error=storable(reason)[:1000], finished_at=timezone.now()
    )
