from __future__ import annotations

from django.apps import AppConfig


class CacheSafeConfig(AppConfig):
    name = "cachesafe"
    verbose_name = "CacheSafe"

    def ready(self) -> None:
        from . import configchecks  # noqa: F401 - registers the system checks
