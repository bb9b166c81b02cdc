"""The catalog's discovery panel: how far the latest discovery got (polled while it runs), the
demo notice when the catalog holds only made-up models, and the staff button that starts one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST, require_safe

from registry import discovery
from registry.models import DiscoveryRun, HubModel
from registry.signals import discovery_requested

#: The Hub's sort fields in words.
SORT_WORDS = {
    "downloads": "downloads",
    "trendingScore": "trending",
    "likes": "likes",
    "lastModified": "last update",
}
#: A run that has not finished listing after this long is taken for dead (a new one may start).
STUCK_AFTER = timedelta(minutes=15)


def discovery_context(message: str = "") -> dict[str, Any]:
    run = discovery.latest()
    state = discovery.progress(run) if run is not None else None
    real = HubModel.objects.filter(is_demo=False).exists()
    return {
        "discovery": state,
        "demo_only": not real,
        "hub_endpoint": settings.HF_ENDPOINT,
        "discovery_message": message,
        "discovery_settings": {
            "limit": settings.DISCOVERY_LIMIT,
            "sorts": [SORT_WORDS.get(sort, sort) for sort in settings.DISCOVERY_SORTS],
            "pipeline_tags": settings.DISCOVERY_PIPELINE_TAGS,
        },
    }


@require_safe
def discovery_panel(request: HttpRequest) -> HttpResponse:
    """The panel alone (what the catalog polls while a discovery runs); never cached."""
    response = render(request, "dashboard/discovery.html", discovery_context())
    response["Cache-Control"] = "no-store"
    return response


def _running(run: DiscoveryRun | None) -> bool:
    return (
        run is not None
        and run.finished_at is None
        and run.started_at > timezone.now() - STUCK_AFTER
    )


@require_POST
def start_discovery(request: HttpRequest) -> HttpResponse:
    """Staff only: queue a discovery run, unless one is still listing."""
    if not request.user.is_staff:
        raise PermissionDenied("staff only")
    message = ""
    with transaction.atomic():
        if _running(discovery.latest()):
            message = "A discovery is already running."
        else:
            run = DiscoveryRun.objects.create(trigger="button")
            discovery_requested.send(sender=DiscoveryRun, run_id=run.pk)
    if not getattr(request, "htmx", False):
        return HttpResponseRedirect(reverse("dashboard:catalog"))
    response = render(request, "dashboard/discovery.html", discovery_context(message))
    response["Cache-Control"] = "no-store"
    return response
