"""Staff actions on a model page: re-sync, re-check, probe. Thin: the work is the registry's and
the workers'; each answers with the live progress partial (htmx) or goes back to the page."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from registry.models import HubModel
from registry.pipeline import request_check
from registry.probes import request_probe_once
from registry.tracking import enqueue_sync

from .htmx import HtmxHttpRequest
from .views import UnknownModel, _model_or_404, model_context, probe_context

Action = Callable[[HtmxHttpRequest, HubModel], HttpResponse]


def staff_action(action: Action) -> Callable[[HtmxHttpRequest, str, str], HttpResponse]:
    """POST only, staff only (403 for everyone else), on a tracked model (404 otherwise)."""

    @require_POST
    @functools.wraps(action)
    def wrapper(request: HtmxHttpRequest, org: str, name: str) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("staff only")
        try:
            model = _model_or_404(request, org, name)
        except UnknownModel as exc:
            raise Http404(str(exc)) from exc
        response = action(request, model)
        response["Cache-Control"] = "no-store"
        return response

    return wrapper


def _back(model: HubModel, **params: str) -> HttpResponseRedirect:
    org, name = model.repo_id.split("/", 1)
    url = reverse("dashboard:model", args=[org, name])
    return HttpResponseRedirect(f"{url}?{urlencode(params)}" if params else url)


def _partial(
    request: HttpRequest, model: HubModel, partial: str, sync_since: datetime | None = None
) -> HttpResponse:
    context = model_context(request, model, model.current_snapshot, sync_since=sync_since)
    return render(request, f"dashboard/model.html#{partial}", context)


@staff_action
def resync(request: HtmxHttpRequest, model: HubModel) -> HttpResponse:
    """Enqueue a forced sync; progress is "queued" until `last_synced_at` passes this moment."""
    # The time travels in the page's URL (?sync=<epoch>) while it polls.
    asked = timezone.now()
    enqueue_sync(model.pk, force=True)
    if not request.htmx:
        return _back(model, sync=f"{asked.timestamp():.6f}")
    return _partial(request, model, "sync-status", sync_since=asked)


@staff_action
def recheck(request: HtmxHttpRequest, model: HubModel) -> HttpResponse:
    """Check the current default template and every named template again, whatever is stored."""
    snapshot = model.current_snapshot
    if snapshot is None:
        raise Http404("this model has no template yet")
    versions = {snapshot.default_template_id: snapshot.default_template}
    versions |= {
        n.version_id: n.version for n in snapshot.named_templates.select_related("version")
    }
    with transaction.atomic():
        for version in versions.values():
            request_check(version, force=True, tokenizer_sha=snapshot.tokenizer_json_sha)
    if not request.htmx:
        return _back(model)
    return _partial(request, model, "check-status")


@staff_action
def probe(request: HtmxHttpRequest, model: HubModel) -> HttpResponse:
    """Queue a probe on the Mac worker (or show the one already waiting)."""
    request_probe_once(model)
    if not request.htmx:
        return _back(model)
    return render(request, "dashboard/model.html#probe-status", probe_context(request, model))
