"""The JSON API, all of it: one view per route in dashboard/urls.py.

`GET /api/models`: search and list (the catalog's query parameters).
`POST /api/models`: track a repo by id (CSRF-exempt JSON, rate-limited per client address).
`GET /api/models/<org>/<name>`: one model (registry.api.model_json), its check and latest probe.
`GET /api/templates/<sha256>`, `GET /api/checks/<sha256>`, `GET /api/probes`.
`GET /api/openapi.json`: the hand-written schema (openapi.py).
`POST /hooks/hub`: a Hub webhook; syncs the repo it names (registry.webhooks).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from checks.digest import variant_key
from registry import tracking, webhooks
from registry.api import model_json
from registry.models import (
    CheckRun,
    CheckStatus,
    HubModel,
    ProbeRun,
    TemplateVersion,
    validate_repo_id,
)
from registry.verdicts import latest_check
from workers.health import cached_status

from .catalog import PAGE_SIZE, CatalogQuery, models_using
from .openapi import schema
from .page_cache import cached_page
from .probes import ProbeQueue, latest_probe
from .stored_reports import failing_pairs, rebuild


def _error(message: str, status: int, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _body(request: HttpRequest) -> dict[str, Any] | None:
    """The request's JSON object, or None when the body is not one."""
    try:
        payload = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def _model_url(repo_id: str) -> str:
    org, name = repo_id.split("/", 1)
    return reverse("dashboard:model", args=[org, name])


def _absolute(request: HttpRequest, path: str) -> str:
    return request.build_absolute_uri(path)


def model_row(request: HttpRequest, model: HubModel) -> dict[str, Any]:
    catalog = getattr(model, "catalog_verdict", None)
    return {
        "repo_id": model.repo_id,
        "author": model.author,
        "family": model.family,
        "status": model.status,
        "verdict": model.verdict,
        "summary": model.verdict_summary,
        "thinking": catalog.thinking if catalog else None,
        "thinking_off": (catalog.thinking_off or None) if catalog else None,
        "thinking_on": (catalog.thinking_on or None) if catalog else None,
        "tools": catalog.tools if catalog else None,
        "probe": catalog.probe if catalog else "none",
        "is_hybrid": model.is_hybrid,
        "downloads": model.downloads,
        "last_template_change_at": (
            model.last_template_change_at.isoformat() if model.last_template_change_at else None
        ),
        "url": _absolute(request, _model_url(model.repo_id)),
    }


@csrf_exempt
def models(request: HttpRequest) -> HttpResponse:
    """`/api/models`: POST tracks a repo, anything else is the search (which allows only GET)."""
    if request.method == "POST":
        return track_repo(request)
    return models_list(request)


@require_GET
@cached_page
def models_list(request: HttpRequest) -> JsonResponse:
    """Search and list: the catalog's query parameters, as JSON."""
    query = CatalogQuery.from_params(request.GET)
    page = Paginator(query.models(), PAGE_SIZE).get_page(query.page)
    path = reverse("dashboard:api_models")

    def link(number: int) -> str:
        return _absolute(request, path + query.url(page=str(number)))

    return JsonResponse(
        {
            "count": page.paginator.count,
            "page": page.number,
            "pages": page.paginator.num_pages,
            "next": link(page.next_page_number()) if page.has_next() else None,
            "previous": link(page.previous_page_number()) if page.has_previous() else None,
            "results": [model_row(request, model) for model in page],
        }
    )


def track_repo(request: HttpRequest) -> JsonResponse:
    if not tracking.may_track(request):
        response = _error("too many track requests from this address; try again later", 429)
        response["Retry-After"] = "3600"
        return response
    payload = _body(request)
    if payload is None or not isinstance(payload.get("repo_id"), str):
        return _error('expected a JSON body {"repo_id": "owner/name"}', 400)
    try:
        repo_id = validate_repo_id(payload["repo_id"])
    except ValidationError as err:
        return _error(err.messages[0], 400)
    model, created = tracking.track(repo_id, via="api")
    response = JsonResponse(model_json(model), status=201 if created else 200)
    response["Location"] = f"/api/models/{model.repo_id}"
    return response


def check_payload(request: HttpRequest, version: TemplateVersion, run: CheckRun) -> dict[str, Any]:
    """A check's status, verdict, variants and failures, each failure with its diff page."""
    report = rebuild(run.report) if run.status == CheckStatus.DONE else None
    data: dict[str, Any] = {
        "template_sha256": version.sha256,
        "engine_version": run.engine_version,
        "status": run.status,
        "progress": run.progress,
        "verdict": run.verdict,
        "summary": run.summary,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "variants": [],
        "failures": [],
        "findings": [],
    }
    if report is None:
        return data
    data["variants"] = [
        {
            "key": variant_key(v),
            "label": v.label,
            "template_name": v.template_name,
            "kwargs": v.kwargs,
            "verdict": v.verdict,
            "mean_reusable_share": v.mean_reusable_share,
        }
        for v in report.variants
    ]
    failures = []
    for location in failing_pairs(report):
        pair, divergence = location.pair, location.pair.divergence
        url = reverse("dashboard:pair", args=[version.sha256, *location.url_args])
        failures.append(
            {
                "variant": location.variant_key,
                "session": location.session.session,
                "request_index": pair.index,
                "status": pair.status,
                "cause": pair.cause,
                "detail": pair.detail,
                "byte_offset": divergence.byte_offset if divergence else None,
                "token_index": divergence.token_index if divergence else None,
                "segment": divergence.segment_before if divergence else None,
                "template_lines": (
                    sorted(set(divergence.lines_before + divergence.lines_after))
                    if divergence
                    else []
                ),
                "reusable_share": pair.reusable_share,
                "diff_url": _absolute(request, url),
            }
        )
    data["failures"] = failures
    data["findings"] = [
        {"kind": f.kind, "lines": list(f.lines), "message": f.message, "status": f.status}
        for f in report.findings
    ]
    return data


@require_GET
@cached_page
def template_detail(request: HttpRequest, sha256: str) -> JsonResponse:
    version = get_object_or_404(TemplateVersion, sha256=sha256)
    run = latest_check(version)
    users = [model.repo_id for model in models_using(version, limit=500)]
    return JsonResponse(
        {
            "sha256": version.sha256,
            "size": version.size,
            "first_seen": version.first_seen.isoformat(),
            "text": version.text,
            "url": _absolute(request, reverse("dashboard:template", args=[version.sha256])),
            "check": check_payload(request, version, run) if run else None,
            "models": [
                {"repo_id": repo_id, "url": _absolute(request, _model_url(repo_id))}
                for repo_id in users
            ],
        }
    )


@require_GET
@cached_page
def check_detail(request: HttpRequest, sha256: str) -> JsonResponse:
    """The newest check of a template version, with every failing pair."""
    version = get_object_or_404(TemplateVersion.objects.defer("text"), sha256=sha256)
    run = latest_check(version)
    if run is None:
        return JsonResponse({"error": "this template has not been checked yet"}, status=404)
    return JsonResponse(check_payload(request, version, run))


@require_GET
def model_detail(request: HttpRequest, org: str, name: str) -> JsonResponse:
    """The registry's fields, then the current check with variants and failures, the
    per-variant verdicts, and the latest probe (null if never probed)."""
    repo_id = f"{org}/{name}"
    model = (
        HubModel.objects.filter(repo_id=repo_id).first()
        or HubModel.objects.filter(repo_id__iexact=repo_id).first()
    )
    if model is None:
        return _error(f"{repo_id} is not tracked", 404, repo_id=repo_id)
    snapshot = model.current_snapshot
    check = latest_check(snapshot.default_template) if snapshot else None
    catalog = getattr(model, "catalog_verdict", None)
    return JsonResponse(
        model_json(model)
        | {
            "variants": catalog.variants if catalog else [],
            "check": check_payload(request, snapshot.default_template, check)
            if snapshot and check
            else None,
            "probe": probe_payload(request, run) if (run := latest_probe(model)) else None,
            "page_url": _absolute(request, _model_url(model.repo_id)),
        }
    )


def _when(moment: Any) -> str | None:
    return moment.isoformat() if moment else None


def probe_payload(request: HttpRequest, run: ProbeRun) -> dict[str, Any]:
    """A probe run without its report: state, verdict, machine, times, the model's page."""
    return {
        "id": run.pk,
        "repo_id": run.model.repo_id,
        "commit_sha": run.commit_sha,
        "state": run.state,
        "verdict": run.verdict or None,
        "reused_share": run.reused_share,
        "disagreement": run.disagreement,
        "error": run.error or None,
        "worker": run.worker or None,
        "machine": run.machine,
        "queued_at": _when(run.queued_at),
        "started_at": _when(run.started_at),
        "finished_at": _when(run.finished_at),
        "page_url": _absolute(request, _model_url(run.model.repo_id)),
    }


@require_GET
def probe_queue(request: HttpRequest) -> JsonResponse:
    """The probe queue page as JSON: waiting probes in order, recent ones, the Mac worker."""
    queue = ProbeQueue.load()
    worker = cached_status().probe_worker
    return JsonResponse(
        {
            "worker": {"online": worker.ok, "detail": worker.detail, "since": _when(worker.since)},
            "queue_size": len(queue.waiting),
            "waiting": [
                probe_payload(request, q.run) | {"position": q.position} for q in queue.waiting
            ],
            "recent": [
                probe_payload(request, f.run)
                | {"seconds": f.duration.total_seconds() if f.duration else None}
                for f in queue.recent
            ],
        }
    )


@require_GET
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(schema(_absolute(request, "/")))


@csrf_exempt
@require_POST
def hub_webhook(request: HttpRequest) -> JsonResponse:
    """A Hub webhook: verify its secret, then sync the model repo it is about."""
    if not webhooks.secret_matches(request.headers.get("X-Webhook-Secret", "")):
        return _error("bad or missing X-Webhook-Secret", 403)
    try:
        outcome = webhooks.handle(_body(request) or {})
    except ValidationError as err:
        return _error(err.messages[0], 400)
    if outcome.ignored is not None:
        return JsonResponse({"ignored": outcome.ignored}, status=202)
    return JsonResponse({"queued": outcome.queued}, status=202)
