"""Start tracking repos, from the site, the API, a webhook or a watch; queue their first sync."""

from __future__ import annotations

import logging

from django.http import HttpRequest

from . import rate_limits
from .models import HubModel, ModelStatus
from .signals import sync_requested, syncs_requested

logger = logging.getLogger(__name__)

#: Repos one client address may ask us to track per hour (the form and the JSON API together).
TRACK_REQUESTS_PER_HOUR = 30


def enqueue_sync(model_pk: int, *, force: bool = False) -> None:
    """Ask for a sync of this model (queued once the current transaction commits); `force`
    re-reads the repo even when its head did not move."""
    sync_requested.send(sender=HubModel, model_pk=model_pk, force=force)


def enqueue_syncs(model_pks: list[int], *, force: bool = False) -> None:
    """Ask for the syncs of several models at once (a discovery's or a watch's new repos):
    queued in batches, each synced by one task."""
    if model_pks:
        syncs_requested.send(sender=HubModel, model_pks=list(model_pks), force=force)


def needs_first_sync(model: HubModel, created: bool) -> bool:
    """A model just tracked (or tracked before and never synced) waits for its first sync."""
    return created or model.status == ModelStatus.PENDING


def track(repo_id: str, via: str) -> tuple[HubModel, bool]:
    """Track `repo_id` (already validated); queue a sync when it is new or never synced."""
    model, created = HubModel.objects.track(repo_id, via=via)
    if needs_first_sync(model, created):
        enqueue_sync(model.pk)
    return model, created


def client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is whatever the client wants it to be unless a proxy
    # we trust rewrote it, and the proxy setup is not ours to assume.
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def may_track(request: HttpRequest) -> bool:
    """False when this client address asked to track too many repos this hour."""
    return rate_limits.allow(f"track:{client_address(request)}", TRACK_REQUESTS_PER_HOUR, 3600)


def forget_track_requests(address: str) -> None:
    rate_limits.forget(f"track:{address}", 3600)
