"""Background work: the Celery app, its tasks and the Mac probe."""

from __future__ import annotations

from .celery import app

__all__ = ["app"]
