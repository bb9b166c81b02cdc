from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the signals that expire cached pages, in every process that saves rows
        # (web, Celery workers, management commands), not only where views are imported.
        from . import page_cache  # noqa: F401
