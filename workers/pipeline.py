"""The check pipeline's state changes. Postgres holds the state; the Celery tasks call these.

A template change claims itself once, records an event and asks for a check of the new version.
A check runs once per (template sha256, engine version), however many models share the template;
its result updates every model that uses the version and records an event when a verdict flips.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from checks import ENGINE_VERSION, TemplateReport
from registry.models import (
    CheckRun,
    CheckStatus,
    EventKind,
    HubModel,
    ModelEvent,
    NamedTemplate,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
    Verdict,
)
from registry.verdicts import record_check

from .receivers import announce_events

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
        ModelEvent.objects.bulk_create(
            [_template_event(change) for change in changes], ignore_conflicts=True
        )
        announce_events()
        wanted = {
            (c.new_version_id, _tokenizer_of(c)): c.model_id
            for c in changes
            if c.new_version_id is not None
        }
        runs = request_checks(wanted)
        done = {(r.template_version_id, r.tokenizer_sha) for r in runs if r.status == "done"}
        if done:
            # Already checked (a template shared with other models): the verdict applies now.
            refresh_model_verdicts(
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
        summary=f"{change.model.repo_id}: chat template changed "
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
        before = dict(_models_using([version.pk], None).values_list("pk", "verdict"))
        parsed = TemplateReport.from_dict(report)
        if parsed.engine_version != run.engine_version:
            raise ValueError(f"report of engine {parsed.engine_version} for run {run.pk}")
        # The one place a report enters the database (run, default-template verdict, catalog
        # columns); then the verdict of models with several named templates, and the events.
        record_check(version, parsed, tokenizer_sha=run.tokenizer_sha)
        return refresh_model_verdicts([version.pk], before=before)


def _models_using(version_ids: list[int], model_ids: Iterable[int] | None) -> Any:
    models = HubModel.objects.filter(
        Q(current_snapshot__default_template__in=version_ids)
        | Q(current_snapshot__named_templates__version__in=version_ids)
    )
    if model_ids is not None:
        models = models.filter(pk__in=list(model_ids))
    return models.distinct()


@dataclass(frozen=True)
class _Target:
    verdict: str
    summary: str
    run_id: int


def _targets(rows: list[dict[str, Any]]) -> dict[int, _Target | None]:
    """The verdict each model should show: the worst of its named templates' checks (None while
    one of them is unchecked)."""
    snapshot_ids = [row["current_snapshot_id"] for row in rows]
    named: dict[int, dict[str, int]] = defaultdict(dict)
    for snapshot_id, name, version_id in NamedTemplate.objects.filter(
        snapshot_id__in=snapshot_ids
    ).values_list("snapshot_id", "name", "version_id"):
        named[snapshot_id][name] = version_id
    wanted = {v for row in rows for v in named[row["current_snapshot_id"]].values()}
    wanted |= {row["current_snapshot__default_template_id"] for row in rows}
    runs = {
        (run.template_version_id, run.tokenizer_sha): run
        for run in CheckRun.objects.filter(
            template_version__in=wanted, engine_version=ENGINE_VERSION, status=CheckStatus.DONE
        ).only("id", "template_version_id", "tokenizer_sha", "verdict", "summary")
    }
    targets: dict[int, _Target | None] = {}
    for row in rows:
        default = row["current_snapshot__default_template_id"]
        tokenizer = row["current_snapshot__tokenizer_json_sha"]
        names = named[row["current_snapshot_id"]]
        needed = {(v, tokenizer) for v in {default, *names.values()}}
        if not needed <= runs.keys():
            targets[row["pk"]] = None
            continue
        worst = max((runs[k] for k in needed), key=lambda r: VERDICT_SEVERITY[Verdict(r.verdict)])
        summary = runs[(default, tokenizer)].summary
        if worst.template_version_id != default:
            name = next(n for n, v in names.items() if v == worst.template_version_id)
            summary = f"{summary} Its “{name}” template: {worst.summary}"
        targets[row["pk"]] = _Target(worst.verdict, summary, worst.pk)
    return targets


def refresh_model_verdicts(
    version_ids: Iterable[int],
    *,
    model_ids: Iterable[int] | None = None,
    before: dict[int, str] | None = None,
) -> list[int]:
    """Recompute the verdict of the models using these versions; record flips as events.

    `before` holds the verdicts as they were before the caller changed anything. Models that
    end with the same verdict and summary are updated in one statement per group, so a template
    shared by thousands of models costs a handful of queries.
    """
    rows = list(
        _models_using(list(version_ids), model_ids).values(
            "pk", "repo_id", "verdict", "verdict_summary", "current_snapshot_id",
            "current_snapshot__default_template_id", "current_snapshot__tokenizer_json_sha",
        )
    )  # fmt: skip
    targets = _targets(rows)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    restore: dict[str, list[int]] = defaultdict(list)
    events: list[ModelEvent] = []
    now = timezone.now()
    for row in rows:
        target = targets[row["pk"]]
        old = (before or {}).get(row["pk"], row["verdict"])
        if target is None:
            # Until every named template is checked the model keeps the verdict it had
            # (record_check wrote the default template's alone).
            if row["verdict"] != old:
                restore[old].append(row["pk"])
            continue
        if (row["verdict"], row["verdict_summary"]) != (target.verdict, target.summary):
            groups[(target.verdict, target.summary)].append(row["pk"])
        if old != target.verdict and old != Verdict.PENDING:
            events.append(
                ModelEvent(
                    model_id=row["pk"],
                    kind=EventKind.VERDICT_CHANGED,
                    key=f"verdict:{row['pk']}:{target.run_id}:{old}:{target.verdict}",
                    summary=f"{row['repo_id']}: {Verdict(old).label} → "
                    f"{Verdict(target.verdict).label}",
                    data={"old": old, "new": target.verdict, "check_run_id": target.run_id},
                    created_at=now,
                )
            )
    for (verdict, summary), ids in groups.items():
        HubModel.objects.filter(pk__in=ids).update(
            verdict=verdict, verdict_summary=summary, verdict_updated_at=now
        )
    for verdict, ids in restore.items():
        HubModel.objects.filter(pk__in=ids).update(verdict=verdict)
    # ignore_conflicts: a retried store records nothing twice (`key` is unique).
    ModelEvent.objects.bulk_create(events, ignore_conflicts=True, batch_size=1000)
    if events:
        announce_events()
    return [event.model_id for event in events]
