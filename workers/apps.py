from __future__ import annotations

from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Workers"

    def ready(self) -> None:
        # The Celery app first: every process that enqueues (web, commands) needs it configured.
        from . import celery, heartbeat, schedule  # noqa: F401 - the app, signal receivers
