"""The JSON API, all of it, declared once with django-ninja: the schemas in api_schemas.py
validate what comes in and make `/api/openapi.json`; api_errors.py gives every error one shape.

`GET /api/models`: search and list (the catalog's query parameters).
`POST /api/models`: track a repo by id (JSON only, rate-limited per client address).
`GET /api/models/{org}/{name}`: one model (registry.api.model_json), its check and latest probe.
`GET /api/templates/{sha256}`, `GET /api/checks/{sha256}`, `GET /api/probes`.
`GET /api/openapi.json`: the schema, generated; `GET /api/docs`: the same, for people.
`POST /hooks/hub`: a Hub webhook; syncs the repo it names (registry.webhooks).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.urls import URLPattern, path, reverse
from ninja import NinjaAPI, Query
from ninja.decorators import decorate_view
from ninja.openapi.docs import Swagger
from ninja.openapi.schema import OpenAPISchema
from ninja.params import P, PathEx
from ninja.responses import Status
from ninja.security import APIKeyHeader
from ninja.throttling import BaseThrottle
from ninja.types import DictStrAny

from checks.digest import variant_key
from checks.setups import Setup, setup_verdict
from registry import tracking, webhooks
from registry.api import model_json
from registry.models import CheckRun, CheckStatus, HubModel, ProbeRun, TemplateVersion
from registry.verdicts import latest_check, model_check
from workers.health import cached_status

from . import api_schemas as s
from . import diagnosis
from .api_errors import ApiError, JsonParser, json_body, json_errors, response_for
from .catalog import (
    PAGE_SIZE,
    CappedPaginator,
    CatalogQuery,
    CatalogRow,
    models_using,
)
from .page_cache import cached_page, shows
from .probes import ProbeQueue, latest_probe
from .stored_reports import failing_pairs, rebuild
from .templatetags.dashboard import model_path, model_url, model_url_stem

#: Largest body accepted by `POST /api/models` (a repo id needs a few hundred bytes).
TRACK_BODY_BYTES = 64 * 1024
DIAGNOSE_BODY_BYTES = 2 * 1024 * 1024 + 256 * 1024
#: Largest Hub webhook payload accepted (the Hub's are a few KiB).
HOOK_BODY_BYTES = 1024 * 1024
#: What a client is told to wait after its hourly track allowance is spent.
TRACK_RETRY_AFTER = 3600

ERRORS = s.ErrorResponse


def retry_after(*codes: int) -> dict[str, Any]:
    """The Retry-After header of these answers, described for clients and schema checkers."""
    header = {"description": "Seconds to wait", "required": True, "schema": {"type": "integer"}}
    return {"responses": {code: {"headers": {"Retry-After": header}} for code in codes}}


class CacheSafeAPI(NinjaAPI):
    """Operations are declared with their whole paths (the API and the Hub hook share one
    root), and answers are plain `application/json`, as before ninja."""

    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: DictStrAny | None = None
    ) -> OpenAPISchema:
        return super().get_openapi_schema(path_prefix="", path_params=path_params)

    def get_content_type(self) -> str:
        return "application/json"

    def set_default_exception_handlers(self) -> None:
        # One handler instead of ninja's several ({"detail": …}, a traceback under DEBUG).
        self.add_exception_handler(Exception, _on_exception)


def _on_exception(request: HttpRequest, exc: Exception | type[Exception]) -> HttpResponse:
    return response_for(exc if isinstance(exc, BaseException) else exc())


class LocalSwagger(Swagger):
    """Swagger UI from ninja's bundled static files (ninja is in INSTALLED_APPS for that), never
    a CDN, and without its online validator badge, which would call out to swagger.io. The page
    is ours (`dashboard/api_docs.html`): ninja's has no language, viewport or icon."""

    template = "dashboard/api_docs.html"

    def get_openapi_url(self, api: NinjaAPI, path_params: DictStrAny) -> str:
        return reverse("dashboard:openapi")


api = CacheSafeAPI(
    title="CacheSafe API",
    version="1",
    description="Which Hugging Face chat templates keep a prompt cache warm.",
    urls_namespace="dashboard",
    # Served by the `openapi` and `docs` operations below, as part of the API.
    openapi_url=None,
    docs=LocalSwagger(settings={"validatorUrl": None}),
    parser=JsonParser(),
)


class WebhookSecret(APIKeyHeader):
    """`X-Webhook-Secret`, compared in constant time (registry.webhooks.secret_matches)."""

    param_name = "X-Webhook-Secret"

    def authenticate(self, request: HttpRequest, key: str | None) -> bool:
        if not webhooks.secret_matches(key or ""):
            raise ApiError(403, "bad or missing X-Webhook-Secret")
        return True


class TrackAllowance(BaseThrottle):
    """The per-address hourly allowance the track form and the API share (registry.tracking)."""

    def allow_request(self, request: HttpRequest) -> bool:
        return tracking.may_track(request)

    def wait(self) -> float:
        return TRACK_RETRY_AFTER


def _absolute(request: HttpRequest, url: str) -> str:
    return request.build_absolute_uri(url)


def model_url_base(request: HttpRequest) -> str:
    """The absolute URL of a model page up to its repo id's path (`model_path`), built once
    for a list: `reverse` and `build_absolute_uri` for each of 50 rows cost 0.65 ms of the
    0.76 its rows took (in one process)."""
    return _absolute(request, model_url_stem())


def _when(moment: Any) -> str | None:
    return moment.isoformat() if moment else None


def model_row(request: HttpRequest, row: CatalogRow, base: str | None = None) -> dict[str, Any]:
    """A catalog row as the API lists it; `base`: `model_url_base(request)`, when the caller
    lists many."""
    catalog = row.verdicts
    return {
        "repo_id": row.repo_id,
        "author": row.author,
        "family": row.family,
        "status": row.status,
        "verdict": row.verdict,
        "summary": row.verdict_summary,
        "thinking": catalog.thinking if catalog else None,
        "thinking_off": (catalog.thinking_off or None) if catalog else None,
        "thinking_on": (catalog.thinking_on or None) if catalog else None,
        "tools": catalog.tools if catalog else None,
        "probe": catalog.probe if catalog else "none",
        "reuse": row.reuse,
        "is_hybrid": row.is_hybrid,
        "format": row.format,
        "base_model": row.base_model,
        "drift": row.drift,
        "downloads": row.downloads,
        "last_template_change_at": _when(row.last_template_change_at),
        "url": (base or model_url_base(request)) + model_path(row.repo_id),
        "setup_verdict": row.setup_verdict,
    }


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
        "finished_at": _when(run.finished_at),
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
            "clients": [
                {k: val for k, val in c.to_dict().items() if k != "sessions"} for c in v.clients
            ],
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
                "prompt_reuse": pair.prompt_reuse,
                "reply_reuse": pair.reply_reuse,
                "diff_url": _absolute(request, url),
            }
        )
    data["failures"] = failures
    data["findings"] = [
        {"kind": f.kind, "lines": list(f.lines), "message": f.message, "status": f.status}
        for f in report.findings
    ]
    return data


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
        "page_url": _absolute(request, model_url(run.model.repo_id)),
    }


def model_detail_payload(
    request: HttpRequest, model: HubModel, setup: Setup | None = None
) -> dict[str, Any]:
    """The registry's fields, then the current check with variants and failures, the
    per-variant verdicts, the verdict for the reader's setup, and the latest probe (null if
    never probed)."""
    found = model_json(model)
    snapshot = model.current_snapshot
    # Named templates none of which is `default` (`sha256` null): no check speaks for the model.
    no_default = snapshot is not None and found["template"]["sha256"] is None
    check = model_check(snapshot) if snapshot and not no_default else None
    catalog = getattr(model, "catalog_verdict", None)
    run = latest_probe(model)
    report = rebuild(check.report) if check and check.status == CheckStatus.DONE else None
    chosen = setup_verdict(report, setup or Setup()) if report is not None else None
    return found | {
        "variants": catalog.variants if catalog and not no_default else [],
        "setup": chosen.to_dict() if chosen else None,
        "check": check_payload(request, snapshot.default_template, check)
        if snapshot and check
        else None,
        "probe": probe_payload(request, run) if run else None,
        "page_url": _absolute(request, model_url(model.repo_id)),
    }


def template_payload(request: HttpRequest, version: TemplateVersion) -> dict[str, Any]:
    run = latest_check(version)
    users = [model.repo_id for model in models_using(version, limit=500)]
    return {
        "sha256": version.sha256,
        "size": version.size,
        "first_seen": version.first_seen.isoformat(),
        "text": version.text,
        "url": _absolute(request, reverse("dashboard:template", args=[version.sha256])),
        "check": check_payload(request, version, run) if run else None,
        "models": [
            {"repo_id": repo_id, "url": _absolute(request, model_url(repo_id))} for repo_id in users
        ],
    }


def probe_queue_payload(request: HttpRequest) -> dict[str, Any]:
    queue = ProbeQueue.load()
    worker = cached_status().probe_worker
    return {
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


def model_list_payload(request: HttpRequest, query: CatalogQuery) -> dict[str, Any]:
    """The catalog's page as JSON, counted as the page counts (up to `COUNT_CAP`): an exact
    count of a broad search read every match, 87 ms for "chat" at 100,000 models and growing
    with the catalog (docs/dashboard.md, "A narrow page read by key, and the API's count")."""
    paginator = CappedPaginator(query, PAGE_SIZE)
    page = paginator.get_page(query.page)
    shows(request, (row.repo_id for row in page), reads_verdicts=query.reads_verdicts)
    listing = reverse("dashboard:api_models")
    base = model_url_base(request)

    def link(number: int) -> str:
        return _absolute(request, listing + query.url(page=str(number)))

    return {
        "count": paginator.shown_count,
        "count_exact": not paginator.capped,
        "page": page.number,
        "pages": paginator.num_pages,
        "next": link(page.next_page_number()) if page.has_next() else None,
        "previous": link(page.previous_page_number()) if page.has_previous() else None,
        "results": [model_row(request, row, base) for row in page],
    }


def catalog_query(filters: s.CatalogFilters) -> CatalogQuery:
    """The validated parameters as the catalog reads them (one parser for the page and API)."""
    params = QueryDict(mutable=True)
    params.update({k: str(v) for k, v in filters.model_dump(exclude_none=True).items()})
    return CatalogQuery.from_params(params)


def tracked(repo_id: str) -> HubModel:
    """The tracked model `repo_id` (exact, else case-insensitive), or a 404."""
    model = HubModel.objects.named(repo_id)
    if model is None:
        raise ApiError(404, f"{repo_id} is not tracked")
    return model


def template_version(sha256: str, *, text: bool = True) -> TemplateVersion:
    versions = TemplateVersion.objects.all() if text else TemplateVersion.objects.defer("text")
    version = versions.filter(sha256=sha256).first()
    if version is None:
        raise ApiError(404, f"no template version {sha256}")
    return version


# The operations. Each documents the errors it can answer; every error is an ErrorResponse.
Sha256 = PathEx[str, P(pattern="^[0-9a-f]{64}$", description="SHA-256 of the template text")]
Org = PathEx[s.RepoPart, P(description="Owner on the Hub")]
Name = PathEx[s.RepoPart, P(description="Repository name on the Hub")]


@api.get(
    "/api/models",
    response={200: s.ModelList, frozenset({400, 503}): ERRORS},
    url_name="api_models",
    operation_id="listModels",
    summary="Search and list tracked models",
    openapi_extra=retry_after(503),
)
@decorate_view(cached_page)
def list_models(request: HttpRequest, filters: Query[s.CatalogFilters]) -> dict[str, Any]:
    return model_list_payload(request, catalog_query(filters))


@api.post(
    "/api/models",
    response={(200, 201): s.TrackedModel, frozenset({400, 413, 415, 429, 503}): ERRORS},
    throttle=TrackAllowance(),
    operation_id="trackModel",
    summary="Track a Hub repo (200 if it already was, 201 if new); its first sync is queued",
    openapi_extra=retry_after(429, 503),
)
@decorate_view(json_body(TRACK_BODY_BYTES))
def track_model(
    request: HttpRequest, payload: s.TrackRequest, response: HttpResponse
) -> Status[dict[str, Any]]:
    # CSRF-exempt (as every ninja operation) because API clients have no CSRF token; a browser
    # cannot send application/json cross-site without a CORS preflight, and json_body refuses
    # every other type, so no other site can make a visitor's browser track repos.
    model, created = tracking.track(payload.repo_id, via="api")  # validated: api_schemas
    response["Location"] = f"/api/models/{model.repo_id}"
    return Status(201 if created else 200, model_json(model))


@api.post(
    "/api/diagnose",
    response={200: s.Diagnosis, frozenset({400, 404, 413, 415, 503}): ERRORS},
    operation_id="diagnose",
    summary="Why did the cache miss? Each request compared with the next: the cause and a hint",
    by_alias=True,
    openapi_extra=retry_after(503),
)
@decorate_view(json_body(DIAGNOSE_BODY_BYTES))
def diagnose_requests(request: HttpRequest, payload: s.DiagnoseRequest) -> dict[str, Any]:
    # Nothing is stored: the bodies live for this request only (docs/diagnose.md).
    bodies = [body.model_dump(exclude_none=True) for body in payload.requests]
    try:
        found = diagnosis.diagnose(
            bodies, repo_id=payload.repo_id or "", template=payload.template or ""
        )
    except diagnosis.DiagnosisError as exc:
        raise ApiError(exc.status, str(exc)) from None
    return {
        "template": found.template,
        "template_sha256": found.template_sha256,
        "requests": found.requests,
        "pairs": found.pairs,
        "error": found.error,
    }


@api.get(
    "/api/models/{org}/{name}",
    response={200: s.ModelDetail, frozenset({400, 404, 503}): ERRORS},
    url_name="api_model",
    operation_id="getModel",
    summary="One model: status, verdict, variants, current template, history, check, probe",
    openapi_extra=retry_after(503),
)
def get_model(
    request: HttpRequest, org: Org, name: Name, setup: Query[s.SetupParams]
) -> dict[str, Any]:
    chosen = Setup.parse(setup.model_dump())  # validated by the schema
    return model_detail_payload(request, tracked(f"{org}/{name}"), chosen)


@api.get(
    "/api/probes",
    response={200: s.ProbeQueue, frozenset({400, 503}): ERRORS},
    url_name="api_probes",
    operation_id="getProbeQueue",
    summary="The Mac probe queue: waiting probes in order, recent ones, the worker",
    openapi_extra=retry_after(503),
)
def probe_queue(request: HttpRequest) -> dict[str, Any]:
    return probe_queue_payload(request)


@api.get(
    "/api/templates/{sha:sha256}",
    response={200: s.Template, frozenset({400, 404, 503}): ERRORS},
    url_name="api_template",
    operation_id="getTemplate",
    summary="One template version: text, check, models that use it",
    openapi_extra=retry_after(503),
)
@decorate_view(cached_page)
def get_template(request: HttpRequest, sha256: Sha256) -> dict[str, Any]:
    return template_payload(request, template_version(sha256))


@api.get(
    "/api/checks/{sha:sha256}",
    response={200: s.Check, frozenset({400, 404, 503}): ERRORS},
    url_name="api_check",
    operation_id="getCheck",
    summary="The newest check of a template version, with every failing pair",
    openapi_extra=retry_after(503),
)
@decorate_view(cached_page)
def get_check(request: HttpRequest, sha256: Sha256) -> dict[str, Any]:
    version = template_version(sha256, text=False)
    run = latest_check(version)
    if run is None:
        raise ApiError(404, "this template has not been checked yet")
    return check_payload(request, version, run)


@api.post(
    "/hooks/hub",
    response={202: s.HookOutcome, frozenset({400, 403, 413, 415, 503}): ERRORS},
    auth=WebhookSecret(),
    url_name="hub_webhook",
    operation_id="hubWebhook",
    summary="A Hub webhook: sync the model repo it is about (needs X-Webhook-Secret)",
    exclude_none=True,
    openapi_extra=retry_after(503),
)
@decorate_view(json_body(HOOK_BODY_BYTES))
def hub_webhook(request: HttpRequest, payload: s.HubWebhook) -> Status[dict[str, Any]]:
    outcome = webhooks.handle(payload.model_dump(exclude_unset=True))
    return Status(202, {"queued": outcome.queued, "ignored": outcome.ignored})


@api.get(
    "/api/openapi.json",
    response={200: dict[str, Any]},
    url_name="openapi",
    operation_id="getOpenApi",
    summary="This document (OpenAPI 3.1, generated from the code)",
)
def openapi(request: HttpRequest) -> OpenAPISchema:
    return api.get_openapi_schema()


@api.get(
    "/api/",
    response={200: dict[str, Any]},
    url_name="api_index",
    operation_id="getApiIndex",
    summary="Where everything is: the docs, the schema, and every operation",
)
def index(request: HttpRequest) -> dict[str, Any]:
    schema = api.get_openapi_schema()
    operations = [
        {
            "method": method.upper(),
            "path": path,
            "summary": str(operation.get("summary", "")),
        }
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    ]
    return {
        "docs": request.build_absolute_uri(reverse("dashboard:api_docs")),
        "openapi": request.build_absolute_uri(reverse("dashboard:openapi")),
        "operations": operations,
    }


@api.get("/api/docs", url_name="api_docs", include_in_schema=False)
def docs(request: HttpRequest) -> HttpResponse:
    """The schema for people (Swagger UI). An HTML page, so not an operation of the schema."""
    return api.docs.render_page(request, api)


def urlpatterns() -> list[URLPattern]:
    """The API's routes for dashboard/urls.py, each behind the JSON error net (api_errors)."""
    patterns, _app, _namespace = api.urls
    return [
        path(str(p.pattern), json_errors(p.callback), name=p.name)
        for p in patterns
        # ninja's root view only names the mount point for its own reverse(); ours is "".
        if isinstance(p, URLPattern) and p.name != "api-root"
    ]
