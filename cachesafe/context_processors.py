from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from workers.health import cached_status


def site(request: HttpRequest) -> dict[str, Any]:
    """The site URL and the service status banner (asked only if a page shows it)."""
    return {
        "SITE_URL": settings.SITE_URL,
        "HF_ENDPOINT": settings.HF_ENDPOINT,
        "service_status": SimpleLazyObject(cached_status),
    }
