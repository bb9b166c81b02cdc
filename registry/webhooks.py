"""Hub webhooks: is the secret right, which model repo is a payload about, and do we sync it.

The HTTP view is `POST /hooks/hub` in dashboard/api.py; this is what it asks the registry.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from . import tracking
from .models import HubModel, Watch, validate_repo_id


def secret_matches(given: str) -> bool:
    """True when `given` is the configured HF_WEBHOOK_SECRET. No secret configured refuses
    everything: an open hook would let anyone make us sync."""
    secret: str = settings.HF_WEBHOOK_SECRET
    return bool(secret) and hmac.compare_digest(given.encode(), secret.encode())


@dataclass(frozen=True)
class Outcome:
    """What a hook did: queued a sync of `queued`, or nothing, because of `ignored`."""

    queued: str | None = None
    ignored: str | None = None


def handle(payload: dict[str, Any]) -> Outcome:
    """Queue a sync of the model repo the payload names, tracking it first when its author is
    watched. Raises ValidationError when the name is not a Hub model id."""
    repo: dict[str, Any] = payload["repo"] if isinstance(payload.get("repo"), dict) else {}
    event: dict[str, Any] = payload["event"] if isinstance(payload.get("event"), dict) else {}
    scope = str(event.get("scope", ""))
    if repo.get("type", "model") != "model" or scope.startswith("discussion"):
        return Outcome(ignored="not a change to a model repo")
    repo_id = validate_repo_id(str(repo.get("name", "")))
    model = HubModel.objects.named(repo_id)  # tracked in the letters a reader typed, maybe
    if model is None:
        if not Watch.objects.covers_author(repo_id.split("/", 1)[0]):
            return Outcome(ignored=f"{repo_id} is not tracked")
        model, _ = HubModel.objects.track(repo_id, via="webhook")
    tracking.enqueue_sync(model.pk)
    return Outcome(queued=model.repo_id)
