from __future__ import annotations

from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Workers"

    def ready(self) -> None:
        from . import heartbeat, receivers, schedule  # noqa: F401 - connects signals
