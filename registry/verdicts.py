"""Store an engine report and spread its verdict to every model that uses the template.

`record_check` is the one place a check result enters the database: the Celery pipeline calls it
with the report the sandbox returned, the demo and the tests with a report computed in-process.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from checks.engine import run_check
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import TemplateReport
from checks.sources import TemplateSource
from dashboard.reports import digest
from registry.models import CatalogVerdict

from .models import CheckRun, CheckStatus, HubModel, TemplateVersion


@transaction.atomic
def record_check(
    template_version: TemplateVersion, report: TemplateReport, *, tokenizer_sha: str | None = None
) -> CheckRun:
    """Save `report` as the finished CheckRun of `template_version` (idempotent per engine
    version and tokenizer), and update the verdict of every model whose current default
    template is this version (and, with `tokenizer_sha`, whose tokenizer.json is that one: the
    registry's id of the file, which the pipeline keys its runs by). Returns the CheckRun."""
    now = timezone.now()
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
            "finished_at": now,
        },
    )
    models = HubModel.objects.filter(current_snapshot__default_template=template_version)
    if tokenizer_sha is not None:
        models = models.filter(current_snapshot__tokenizer_json_sha=tokenizer_sha)
    model_ids = list(models.values_list("id", flat=True))
    HubModel.objects.filter(id__in=model_ids).update(
        verdict=report.verdict, verdict_summary=report.summary, verdict_updated_at=now
    )
    found = digest(report)
    fields = {
        "thinking": found.thinking,
        "thinking_off": found.thinking_off,
        "thinking_on": found.thinking_on,
        "tools": found.tools,
        "variants": found.variants,
    }
    # One upsert for every model of this template (a popular template has thousands).
    CatalogVerdict.objects.bulk_create(
        [CatalogVerdict(model_id=model_id, **fields) for model_id in model_ids],
        update_conflicts=True,
        unique_fields=["model"],
        update_fields=list(fields),
        batch_size=1000,
    )
    return run


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
    return template_version.check_runs.order_by("-created_at", "-id").first()
