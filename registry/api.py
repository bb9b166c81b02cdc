"""The registry's JSON API and the Hub webhook (shapes documented in docs/registry.md).

`GET /api/models/<org>/<name>`: one model, its current template and its history.
`POST /api/models`: track a repo by id (CSRF-exempt JSON, rate-limited per client address).
`POST /hooks/hub`: a Hub webhook; syncs the repo it names.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from . import ratelimit, tracking
from .models import HubModel, TemplateChange, TemplateSnapshot, Watch, validate_repo_id

#: Other apps add fields to the model detail by appending `f(request, model) -> dict` here
#: (in their AppConfig.ready), so `/api/models/<org>/<name>` stays one view.
model_detail_extensions: list[Callable[[HttpRequest, HubModel], dict[str, Any]]] = []

#: `GET /api/models` (search) belongs to the dashboard; this path is also our POST.
LIST_VIEW = "dashboard.api.models_list"


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def template_json(snapshot: TemplateSnapshot | None) -> dict[str, Any] | None:
    if snapshot is None:
        return None
    named = {n.name: n.version.sha256 for n in snapshot.named_templates.all()}
    return {
        "sha256": snapshot.default_template.sha256,
        "source_file": snapshot.source_file,
        "commit": snapshot.commit_sha,
        "named_templates": named,
        "special_tokens": snapshot.special_tokens,
        "tokenizer_json": {"sha": snapshot.tokenizer_json_sha, "size": snapshot.tokenizer_json_size}
        if snapshot.tokenizer_json_sha
        else None,
    }


def change_json(change: TemplateChange) -> dict[str, Any]:
    return {
        "commit": change.commit_sha,
        "date": _iso(change.committed_at),
        "title": change.title,
        "template_sha256": change.new_version.sha256 if change.new_version else None,
        "previous_sha256": change.old_version.sha256 if change.old_version else None,
    }


def model_json(model: HubModel) -> dict[str, Any]:
    """The stable JSON shape of a model (docs/registry.md)."""
    snapshot = None
    if model.current_snapshot_id:
        snapshot = (
            TemplateSnapshot.objects.select_related("default_template")
            .prefetch_related("named_templates__version")
            .get(pk=model.current_snapshot_id)
        )
    changes = model.changes.select_related("new_version", "old_version").order_by(
        "-committed_at", "-id"
    )
    return {
        "repo_id": model.repo_id,
        "author": model.author,
        "status": model.status,
        "status_reason": model.status_reason,
        "sync_error": model.sync_error,
        "verdict": model.verdict,
        "verdict_summary": model.verdict_summary,
        "downloads": model.downloads,
        "likes": model.likes,
        "tags": model.tags,
        "pipeline_tag": model.pipeline_tag,
        "library_name": model.library_name,
        "model_type": model.model_type,
        "architectures": model.architectures,
        "is_hybrid": model.is_hybrid,
        "has_sliding_window": model.has_sliding_window,
        "quantization": model.quantization,
        "base_model": model.base_model,
        "last_commit_sha": model.last_commit_sha or None,
        "last_commit_at": _iso(model.last_commit_at),
        "template": template_json(snapshot),
        "history": [change_json(c) for c in changes],
        "history_complete": model.history_complete,
    }


def _error(message: str, status: int, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


@require_GET
def model_detail(request: HttpRequest, org: str, name: str) -> JsonResponse:
    repo_id = f"{org}/{name}"
    model = (
        HubModel.objects.filter(repo_id=repo_id).first()
        or HubModel.objects.filter(repo_id__iexact=repo_id).first()
    )
    if model is None:
        return _error(f"{repo_id} is not tracked", 404, repo_id=repo_id)
    payload = model_json(model)
    for extension in model_detail_extensions:
        payload |= extension(request, model)
    return JsonResponse(payload)


def _body(request: HttpRequest) -> dict[str, Any] | None:
    try:
        payload = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


@csrf_exempt
def models_collection(request: HttpRequest) -> HttpResponse:
    """`POST /api/models` tracks a repo; `GET` is the dashboard's search when it is installed."""
    if request.method == "POST":
        return track_repo(request)
    try:
        list_view: Callable[[HttpRequest], HttpResponse] = import_string(LIST_VIEW)
    except ImportError:
        return _error('use POST with {"repo_id": "owner/name"}', 405)
    return list_view(request)


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


def webhook_secret() -> str:
    return ratelimit.config_value("HF_WEBHOOK_SECRET", "")


@csrf_exempt
@require_POST
def hub_webhook(request: HttpRequest) -> JsonResponse:
    """A Hub webhook: verify its secret, then sync the model repo it is about."""
    secret = webhook_secret()
    given = request.headers.get("X-Webhook-Secret", "")
    # No secret configured refuses everything: an open hook would let anyone make us sync.
    if not secret or not hmac.compare_digest(given.encode(), secret.encode()):
        return _error("bad or missing X-Webhook-Secret", 403)
    payload = _body(request) or {}
    repo: dict[str, Any] = payload["repo"] if isinstance(payload.get("repo"), dict) else {}
    event: dict[str, Any] = payload["event"] if isinstance(payload.get("event"), dict) else {}
    scope = str(event.get("scope", ""))
    if repo.get("type", "model") != "model" or scope.startswith("discussion"):
        return JsonResponse({"ignored": "not a change to a model repo"}, status=202)
    try:
        repo_id = validate_repo_id(str(repo.get("name", "")))
    except ValidationError as err:
        return _error(err.messages[0], 400)
    model = HubModel.objects.filter(repo_id=repo_id).first()
    if model is None:
        if not Watch.objects.covers_author(repo_id.split("/", 1)[0]):
            return JsonResponse({"ignored": f"{repo_id} is not tracked"}, status=202)
        model, _ = HubModel.objects.track(repo_id, via="webhook")
    tracking.enqueue_sync(model.pk)
    return JsonResponse({"queued": model.repo_id}, status=202)
