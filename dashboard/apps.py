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

        # `GET /api/models/<org>/<name>` is registry.api's view; it merges in what we add
        # (variants, the check with its failures, probe results), so the URL stays one view.
        try:
            from registry import api
        except ImportError:
            return
        from .api import model_check_fields

        if model_check_fields not in api.model_detail_extensions:
            api.model_detail_extensions.append(model_check_fields)
