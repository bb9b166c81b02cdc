from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from dashboard.status import hub_banner
from workers.health import cached_status


def site(request: HttpRequest) -> dict[str, Any]:
    """The site URL and the banners: service status, and whether the Hub can be reached (each
    asked only if a page shows it, and never with a query on the request: both are cached)."""
    return {
        "SITE_URL": settings.SITE_URL,
        "HF_ENDPOINT": settings.HF_ENDPOINT,
        "service_status": SimpleLazyObject(cached_status),
        "hub_unreachable": SimpleLazyObject(hub_banner),
    }
