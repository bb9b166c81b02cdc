"""The one owner of a model's verdict and of every copy of it.

A check's report is saved as a `CheckRun` (`save_run`); `refresh_verdicts` then computes the
verdict of each model that uses the version (the worst over its named templates, once all are
checked) and writes `HubModel.verdict` and `HubModel.reuse`, the catalog row (`CatalogVerdict`)
and a `verdict_changed` event for each flip, in one transaction. Nothing else writes those columns.
Listing pages learn of it through `catalog_changed`, alerts through `events_recorded` (bulk
writes send no post_save).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from checks.digest import CATALOG_ROW_FIELDS, ReportDigest, digest
from checks.engine import run_check
from checks.options import ENGINE_VERSION
from checks.policy import no_default_sentence, without_default
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import TemplateReport
from checks.sources import TemplateSource, has_default

from .derivatives import record_stale_fixes
from .models import (
    CatalogVerdict,
    CheckRun,
    CheckStatus,
    EventKind,
    HubModel,
    ModelEvent,
    NamedTemplate,
    ProbeRun,
    ProbeState,
    ProbeStatus,
    TemplateSnapshot,
    TemplateVersion,
    Verdict,
)
from .signals import catalog_changed, events_recorded

#: Worst first: the verdict of a model with several named templates is the worst of them.
VERDICT_SEVERITY = {
    Verdict.UNSAFE: 4,
    Verdict.ERROR: 3,
    Verdict.SAFE_WHERE_RENDERABLE: 2,
    Verdict.SAFE: 1,
}


def save_run(
    template_version: TemplateVersion, report: TemplateReport, *, tokenizer_sha: str | None = None
) -> CheckRun:
    """Save `report` as the finished CheckRun of the version (idempotent per engine version
    and tokenizer: `tokenizer_sha` is the registry's id of the tokenizer.json, else the
    report's own). Models are not touched: `refresh_verdicts` does that."""
    key = tokenizer_sha if tokenizer_sha is not None else report.tokenizer_sha256 or ""
    run, _ = CheckRun.objects.update_or_create(
        template_version=template_version,
        engine_version=report.engine_version,
        tokenizer_sha=key,
        defaults={
            "status": CheckStatus.DONE,
            "verdict": report.verdict,
            "summary": report.summary,
            "report": report.to_dict(),
            "error": report.reason or "",
            "progress": 100,
            "finished_at": timezone.now(),
        },
    )
    return run


@transaction.atomic
def record_check(
    template_version: TemplateVersion, report: TemplateReport, *, tokenizer_sha: str | None = None
) -> CheckRun:
    """Save a report and bring every model that uses the version up to date."""
    run = save_run(template_version, report, tokenizer_sha=tokenizer_sha)
    refresh_verdicts([template_version.pk])
    return run


def models_using(version_ids: Iterable[int], model_ids: Iterable[int] | None = None) -> Any:
    """Models whose current snapshot uses one of these versions, default or named."""
    ids = list(version_ids)
    models = HubModel.objects.filter(
        Q(current_snapshot__default_template__in=ids)
        | Q(current_snapshot__named_templates__version__in=ids)
    )
    if model_ids is not None:
        models = models.filter(pk__in=list(model_ids))
    return models.distinct()


@dataclass(frozen=True)
class _Target:
    verdict: str
    summary: str
    run_id: int
    #: The default template's run: what the catalog row digests.
    default_run_id: int


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
        default_run = runs[(default, tokenizer)]
        verdict, summary = worst.verdict, default_run.summary
        if not has_default(names):
            # `default_template` only stands in: no template is the default to speak for.
            name = min(n for n, v in names.items() if runs[(v, tokenizer)].verdict == verdict)
            worst = runs[(names[name], tokenizer)]
            verdict = without_default(verdict)
            summary = f"{no_default_sentence(names)} Its “{name}” template: {worst.summary}"
        elif worst.template_version_id != default:
            name = next(n for n, v in names.items() if v == worst.template_version_id)
            summary = f"{summary} Its “{name}” template: {worst.summary}"
        targets[row["pk"]] = _Target(verdict, summary, worst.pk, default_run.pk)
    return targets


def _digests(run_ids: set[int]) -> dict[int, ReportDigest]:
    """The catalog columns of each run's report, computed once per run."""
    found: dict[int, ReportDigest] = {}
    for run_id, data in CheckRun.objects.filter(pk__in=run_ids).values_list("pk", "report"):
        try:
            report = TemplateReport.from_dict(data) if data else None
        except (KeyError, TypeError, ValueError):
            report = None
        if report is not None:
            found[run_id] = digest(report)
    return found


@transaction.atomic
def refresh_verdicts(
    version_ids: Iterable[int], *, model_ids: Iterable[int] | None = None
) -> list[int]:
    """Recompute the verdict of the models using these versions; return the ids that flipped.

    Until every named template of a model is checked, the model keeps what it showed. Models
    that end with the same verdict and summary are updated in one statement per group, so a
    template shared by thousands of models costs a handful of queries.
    """
    rows = list(
        models_using(version_ids, model_ids).values(
            "pk", "repo_id", "verdict", "verdict_summary", "reuse", "current_snapshot_id",
            "current_snapshot__default_template_id", "current_snapshot__tokenizer_json_sha",
        )
    )  # fmt: skip
    targets = _targets(rows)
    digests = _digests({t.default_run_id for t in targets.values() if t is not None})
    # By what the models' rows get: verdict, summary, reuse figure, and whether the verdict
    # changed (else only the figure did). Only rows that change are written, each once: on
    # PostgreSQL every write is a new row version with new entries in the catalog's indexes.
    groups: dict[tuple[str, str, float | None, bool], list[int]] = defaultdict(list)
    catalog: dict[int, list[int]] = defaultdict(list)
    events: list[ModelEvent] = []
    now = timezone.now()
    for row in rows:
        target = targets[row["pk"]]
        if target is None:
            continue
        catalog[target.default_run_id].append(row["pk"])
        old = row["verdict"]
        shown = digests.get(target.default_run_id)
        reuse = shown.reuse if shown is not None else row["reuse"]
        changed = (old, row["verdict_summary"]) != (target.verdict, target.summary)
        if changed or reuse != row["reuse"]:
            groups[(target.verdict, target.summary, reuse, changed)].append(row["pk"])
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
    for (verdict, summary, reuse, changed), ids in groups.items():
        moment = {"verdict_updated_at": now} if changed else {}
        HubModel.objects.filter(pk__in=ids).update(
            verdict=verdict, verdict_summary=summary, reuse=reuse, **moment
        )
    rows_to_write = [
        CatalogVerdict(model_id=model_id, **digests[run_id].fields())
        for run_id, ids in catalog.items()
        if run_id in digests
        for model_id in ids
    ]
    # One upsert for every model of these templates (a popular template has thousands).
    CatalogVerdict.objects.bulk_create(
        rows_to_write,
        update_conflicts=True,
        unique_fields=["model"],
        update_fields=list(CATALOG_ROW_FIELDS),
        batch_size=1000,
    )
    # ignore_conflicts: a retried store records nothing twice (`key` is unique).
    ModelEvent.objects.bulk_create(events, ignore_conflicts=True, batch_size=1000)
    if events:
        events_recorded.send(sender=ModelEvent)
    # A base that turned cache-safe, or a derivative whose verdict says it is not: who still
    # carries a template its base has fixed.
    record_stale_fixes(pk for (*_, changed), ids in groups.items() if changed for pk in ids)
    if groups or rows_to_write:
        catalog_changed.send(
            sender=HubModel,
            model_ids=sorted(pk for ids in catalog.values() for pk in ids),
            verdicts=True,
        )
    return [event.model_id for event in events]


def record_unreadable(model_id: int, reason: str) -> None:
    """A repo whose template files cannot be read (not UTF-8, a `chat_template` that is not a
    string, malformed JSON) and that has no earlier readable template: its verdict is `error`
    with the reason, not `pending` forever. A repo with a readable earlier template keeps that
    template's verdict (the sync status says what broke)."""
    summary = f"Could not check this template: {reason}."
    updated = HubModel.objects.filter(pk=model_id, current_snapshot__isnull=True).exclude(
        verdict=Verdict.ERROR, verdict_summary=summary
    )
    if updated.update(
        verdict=Verdict.ERROR, verdict_summary=summary, verdict_updated_at=timezone.now()
    ):
        catalog_changed.send(sender=HubModel, model_ids=[model_id], verdicts=True)


def record_probe(run: ProbeRun) -> None:
    """Put a stored probe's verdict on the model's catalog row.

    A failed probe measured nothing, so the catalog keeps the last verdict it had.
    """
    if run.state != ProbeState.DONE or run.verdict not in ProbeStatus.values:
        return
    # An upsert: a model probed before its first check has no catalog row yet.
    CatalogVerdict.objects.bulk_create(
        [CatalogVerdict(model_id=run.model_id, probe=run.verdict)],
        update_conflicts=True,
        unique_fields=["model"],
        update_fields=["probe"],
    )
    catalog_changed.send(sender=HubModel, model_ids=[run.model_id], verdicts=True)


def check_in_process(
    template_version: TemplateVersion, special_tokens: dict[str, str] | None = None
) -> TemplateReport:
    """Run the engine here, without the sandbox pool: for trusted templates only (the demo
    catalog, tests). Templates from the Hub go through the Celery pipeline's sandbox."""
    source = TemplateSource(
        {"default": template_version.text},
        dict(special_tokens or {}),
        origin="chat_template.jinja",
        sha256=template_version.sha256,
    )
    return run_check(source, TemplateCache(CheckEnvironment()), file=template_version.sha256[:12])


def latest_check(template_version: TemplateVersion) -> CheckRun | None:
    """The newest check of a version, finished or not."""
    runs: QuerySet[CheckRun] = template_version.check_runs.order_by("-created_at", "-id")
    return runs.first()


def model_check(snapshot: TemplateSnapshot) -> CheckRun | None:
    """The check a model's page and API show: the newest run of its default template with its
    own tokenizer.json (on bytes when it has none), finished or not; the pair its verdict is
    computed from (`refresh_verdicts`, which reads only finished runs of this engine version).
    A template shared by repos with different tokenizers has a run for each: the newest run of
    the version could be another repo's, with that repo's tokenizer and its reason for checking
    on bytes. The newest run of any tokenizer only when this pair has never been asked for (a
    model recorded before runs were per tokenizer)."""
    runs: QuerySet[CheckRun] = snapshot.default_template.check_runs.order_by("-created_at", "-id")
    own = runs.filter(tokenizer_sha=snapshot.tokenizer_json_sha).first()
    return own if own is not None else runs.first()
