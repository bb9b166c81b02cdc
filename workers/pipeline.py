"""The check pipeline's state changes. Postgres holds the state; the Celery tasks call these.

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
from registry.models import (
    CheckRun,
    CheckStatus,
    HubModel,
    NamedTemplate,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
    Verdict,
)
from registry.verdicts import record_check

from .models import EventKind, ModelEvent

logger = logging.getLogger(__name__)

#: Worst first: the verdict of a model with several named templates is the worst of them.
VERDICT_SEVERITY = {
    Verdict.UNSAFE: 4,
    Verdict.ERROR: 3,
    Verdict.SAFE_WHERE_RENDERABLE: 2,
    Verdict.SAFE: 1,
}
#: A pending run whose message was lost (broker down, worker gone) is sent again after this.
RESEND_PENDING_AFTER = timedelta(minutes=2)


def send_check(run_id: int) -> None:
    """Enqueue a check after the surrounding transaction commits; a broker outage only delays it."""

    def send() -> None:
        from .checking import run_check

        try:
            run_check.apply_async((run_id,), queue="checks")
        except Exception as exc:  # kombu raises many kinds; the sweeper re-sends pending runs
            logger.warning("could not enqueue check %s (will retry from beat): %s", run_id, exc)

    transaction.on_commit(send)


def request_check(version: TemplateVersion, *, force: bool = False) -> CheckRun:
    """Make sure the current engine checks `version`; enqueue only when there is work to do."""
    run, created = CheckRun.objects.get_or_create(
        template_version=version, engine_version=ENGINE_VERSION, tokenizer_sha=""
    )
    if created:
        send_check(run.pk)
    elif force:
        CheckRun.objects.filter(pk=run.pk).update(
            status=CheckStatus.PENDING, progress=0, created_at=timezone.now()
        )
        send_check(run.pk)
    return run


def claim_template_change(change_id: int) -> bool:
    """Act on a template change exactly once: event, then a check of the new version."""
    with transaction.atomic():
        won = (
            TemplateChange.objects.filter(pk=change_id, checks_claimed_at__isnull=True).update(
                checks_claimed_at=timezone.now()
            )
            == 1
        )
        if not won:
            return False
        change = TemplateChange.objects.select_related("model", "new_version", "old_version").get(
            pk=change_id
        )
        old = change.old_version.sha256[:12] if change.old_version else "none"
        new = change.new_version.sha256[:12] if change.new_version else "none"
        ModelEvent.record(
            change.model_id,
            EventKind.TEMPLATE_CHANGED,
            key=f"template:{change.pk}",
            summary=f"{change.model.repo_id}: chat template changed ({old} → {new})",
            data={
                "change_id": change.pk,
                "commit": change.commit_sha,
                "title": change.title,
                "old_sha256": change.old_version.sha256 if change.old_version else None,
                "new_sha256": change.new_version.sha256 if change.new_version else None,
            },
        )
        if change.new_version is not None:
            request_check(change.new_version)
            # Already checked (a template shared with other models): the verdict applies now.
            refresh_model_verdicts([change.new_version.pk])
    return True


def dispatch_template_changes(limit: int = 200) -> int:
    """Claim up to `limit` unclaimed template changes; return how many this call handled."""
    ids = list(
        TemplateChange.objects.filter(checks_claimed_at__isnull=True)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    return sum(claim_template_change(change_id) for change_id in ids)


def versions_in_use() -> Any:
    """Template versions that some model's current snapshot uses (default or named)."""
    current = HubModel.objects.exclude(current_snapshot=None).values("current_snapshot")
    return TemplateVersion.objects.filter(
        Q(default_in__in=current)
        | Q(pk__in=NamedTemplate.objects.filter(snapshot__in=current).values("version"))
    ).distinct()


def request_missing_checks(limit: int = 500) -> int:
    """Ask for checks of versions in use that this engine version has not checked yet."""
    checked = CheckRun.objects.filter(engine_version=ENGINE_VERSION).values("template_version")
    versions = list(versions_in_use().exclude(pk__in=checked).order_by("pk")[:limit])
    with transaction.atomic():
        for version in versions:
            request_check(version)
    return len(versions)


def resend_stalled_checks(limit: int = 500) -> int:
    """Re-send pending runs whose message may be lost; leases make a duplicate harmless."""
    cutoff = timezone.now() - RESEND_PENDING_AFTER
    stalled = list(
        CheckRun.objects.filter(
            Q(status=CheckStatus.PENDING, created_at__lt=cutoff)
            | Q(status=CheckStatus.RUNNING, started_at__lt=cutoff - RESEND_PENDING_AFTER)
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
    with transaction.atomic():
        for run_id in stalled:
            send_check(run_id)
    return len(stalled)


def special_tokens_for(version: TemplateVersion) -> dict[str, str]:
    """The special tokens of a snapshot that uses this version (fine-tunes share them)."""
    snapshot = (
        TemplateSnapshot.objects.filter(
            Q(default_template=version) | Q(named_templates__version=version)
        )
        .order_by("-created_at")
        .values("special_tokens")
        .first()
    )
    tokens = snapshot["special_tokens"] if snapshot else {}
    return {k: v for k, v in tokens.items() if isinstance(k, str) and isinstance(v, str)}


def store_result(run_id: int, report: dict[str, Any]) -> list[int]:
    """Save a finished check and update every model using the version; return the flipped ones."""
    with transaction.atomic():
        run = CheckRun.objects.select_for_update().select_related("template_version").get(pk=run_id)
        version = run.template_version
        before = {m.pk: m.verdict for m in _models_using([version.pk])}
        parsed = TemplateReport.from_dict(report)
        if parsed.engine_version != run.engine_version:
            raise ValueError(f"report of engine {parsed.engine_version} for run {run.pk}")
        # The one place a report enters the database (run, default-template verdict, catalog
        # columns); then the verdict of models with several named templates, and the events.
        record_check(version, parsed)
        return refresh_model_verdicts([version.pk], before=before)


def _models_using(version_ids: Iterable[int]) -> Any:
    ids = list(version_ids)
    return (
        HubModel.objects.filter(
            Q(current_snapshot__default_template__in=ids)
            | Q(current_snapshot__named_templates__version__in=ids)
        )
        .distinct()
        .select_related("current_snapshot")
    )


def refresh_model_verdicts(
    version_ids: Iterable[int], *, before: dict[int, str] | None = None
) -> list[int]:
    """Recompute the verdict of the models using these versions; record flips as events.

    `before` holds the verdicts as they were before the caller changed anything.
    """
    flipped = []
    for model in _models_using(version_ids):
        snapshot = model.current_snapshot
        assert snapshot is not None
        named = dict(snapshot.named_templates.values_list("name", "version_id"))
        wanted = {snapshot.default_template_id, *named.values()}
        runs = {
            run.template_version_id: run
            for run in CheckRun.objects.filter(
                template_version__in=wanted,
                engine_version=ENGINE_VERSION,
                status=CheckStatus.DONE,
            )
        }
        if set(runs) != wanted:
            # Wait until every named template is checked; until then the model keeps the
            # verdict it had (record_check wrote the default template's alone).
            if before is not None and model.pk in before and model.verdict != before[model.pk]:
                HubModel.objects.filter(pk=model.pk).update(verdict=before[model.pk])
            continue
        worst = max(runs.values(), key=lambda r: VERDICT_SEVERITY.get(Verdict(r.verdict), 0))
        summary = runs[snapshot.default_template_id].summary
        if len(wanted) > 1 and worst.template_version_id != snapshot.default_template_id:
            name = next(n for n, v in named.items() if v == worst.template_version_id)
            summary = f"{summary} Its “{name}” template: {worst.summary}"
        old = (before or {}).get(model.pk, model.verdict)
        if model.verdict != worst.verdict or model.verdict_summary != summary:
            HubModel.objects.filter(pk=model.pk).update(
                verdict=worst.verdict, verdict_summary=summary, verdict_updated_at=timezone.now()
            )
        if old != worst.verdict and old != Verdict.PENDING:
            flipped.append(model.pk)
            ModelEvent.record(
                model.pk,
                EventKind.VERDICT_CHANGED,
                key=f"verdict:{model.pk}:{worst.pk}:{old}:{worst.verdict}",
                summary=f"{model.repo_id}: {Verdict(old).label} → {Verdict(worst.verdict).label}",
                data={"old": old, "new": worst.verdict, "check_run_id": worst.pk},
            )
    return flipped
