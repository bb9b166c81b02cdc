from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Workers"

    def ready(self) -> None:
        from registry import jobs

        from . import schedule  # noqa: F401 - writes the default schedule after migrate

        # The Celery app is configured on a process's first send, not at start: a web worker
        # that only serves pages never imports Celery (docs/architecture.md).
        jobs.use_celery_app(_celery_app)


def _celery_app() -> Any:
    from .celery import app

    return app
