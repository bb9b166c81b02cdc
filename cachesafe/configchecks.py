"""Django system checks that explain bad configuration in plain words."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register


@register(deploy=True)
def production_settings(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    if settings.DEBUG:
        messages.append(
            Warning("DEBUG is on.", hint="Set DEBUG=false in production.", id="cachesafe.W001")
        )
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        messages.append(
            Warning(
                "The embedded SQLite database is in use.",
                hint="Set DATABASE_URL=postgres://... for more than one machine or heavy use.",
                id="cachesafe.W002",
            )
        )
    if not settings.REDIS_URL:
        messages.append(
            Warning(
                "The embedded filesystem broker is in use.",
                hint="Set REDIS_URL=redis://host:6379/0 so workers on other machines "
                "(the Mac probe worker) can reach the queues.",
                id="cachesafe.W003",
            )
        )
    return messages


@register()
def site_url(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    url = settings.SITE_URL
    if not url.startswith(("http://", "https://")):
        return [
            Error(
                f"SITE_URL={url!r} is not an absolute http(s) URL.",
                hint="Links in alerts and feeds are built from it, e.g. https://cachesafe.example.",
                id="cachesafe.E001",
            )
        ]
    return []
