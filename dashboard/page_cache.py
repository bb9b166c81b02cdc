"""Rendered pages kept in the cache until the catalog changes.

The dashboard is read far more than it changes: a page is rendered once per *generation* of the
data, and any save of a model, snapshot, change or check starts a new generation (post_save
below, and the registry's `catalog_changed` for its bulk writes). A TTL bounds what a bulk
`.update()` elsewhere could leave stale. A view opts out per response (`Cache-Control:
no-store`) when the page shows live state, such as a check in progress.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.http import HttpRequest, HttpResponse

from registry.models import (
    CheckRun,
    HubModel,
    NamedTemplate,
    ProbeRun,
    TemplateChange,
    TemplateSnapshot,
)
from registry.signals import catalog_changed

logger = logging.getLogger(__name__)
GENERATION_KEY = "dashboard:generation"
DEFAULT_SECONDS = 60
View = TypeVar("View", bound=Callable[..., HttpResponse])


def seconds() -> int:
    """How long a page may be served from the cache (0 turns the cache off)."""
    return int(getattr(settings, "DASHBOARD_PAGE_CACHE_SECONDS", DEFAULT_SECONDS))


# Each process rereads the generation at most this often: a cache hit then costs one lookup,
# and a change shows everywhere within a second.
GENERATION_TTL = 1.0
_local: dict[str, Any] = {"value": None, "read_at": 0.0}


def generation() -> str:
    now = time.monotonic()
    if _local["value"] is None or now - _local["read_at"] > GENERATION_TTL:
        _local["value"] = str(cache.get(GENERATION_KEY) or 0)
        _local["read_at"] = now
    return str(_local["value"])


def bump() -> None:
    """Start a new generation: every cached page is rebuilt on its next request."""
    # A timestamp, not a counter: no race between two writers, and it survives a cache flush.
    try:
        cache.set(GENERATION_KEY, time.time_ns(), None)
    except Exception:  # noqa: BLE001 - a save must not fail because the cache is down
        logger.warning("page cache unavailable; cached pages expire by their TTL only")
    _local["value"] = None  # this process sees its own change at once


def bump_on_commit(**_: Any) -> None:
    bump()
    # Again after commit: a page rendered between the save and the commit saw the old rows.
    transaction.on_commit(bump)


catalog_changed.connect(bump_on_commit, dispatch_uid="dashboard-catalog-changed")
for _model in (HubModel, TemplateSnapshot, NamedTemplate, TemplateChange, CheckRun, ProbeRun):
    post_save.connect(bump_on_commit, sender=_model, dispatch_uid=f"dashboard-save-{_model}")
    post_delete.connect(bump_on_commit, sender=_model, dispatch_uid=f"dashboard-del-{_model}")


def _key(request: HttpRequest) -> str:
    htmx = request.headers.get("HX-Request", "") + "|" + request.headers.get("HX-Target", "")
    raw = f"{generation()}|{htmx}|{request.get_full_path()}"
    return "dashboard:page:" + hashlib.sha256(raw.encode()).hexdigest()


def _is_staff(request: HttpRequest) -> bool:
    """Staff pages carry action forms with a CSRF token: never kept, never served from the cache."""
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_staff)


def cached_page(view: View) -> View:
    """Serve GETs of `view` from the cache while the catalog has not changed."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        timeout = seconds()
        if timeout <= 0 or request.method != "GET" or _is_staff(request):
            return view(request, *args, **kwargs)
        try:
            key = _key(request)
            hit = cache.get(key)
        except Exception:  # noqa: BLE001 - any backend error (Redis down, table missing)
            logger.warning("page cache unavailable; rendering %s", request.path, exc_info=True)
            return view(request, *args, **kwargs)
        if hit is not None:
            content, content_type, cache_control = hit
            response = HttpResponse(content, content_type=content_type)
            if cache_control:
                response["Cache-Control"] = cache_control
            response["X-Cache"] = "hit"
            return response
        response = view(request, *args, **kwargs)
        cache_control = response.get("Cache-Control", "")
        if response.status_code == 200 and "no-store" not in cache_control:
            try:
                cache.set(key, (response.content, response["Content-Type"], cache_control), timeout)
            except Exception:  # noqa: BLE001 - the page is rendered; keeping it is optional
                logger.warning("page cache unavailable; not keeping %s", request.path)
            response["X-Cache"] = "miss"
        return response

    return wrapper  # type: ignore[return-value]
