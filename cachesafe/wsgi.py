"""WSGI entry point (gunicorn cachesafe.wsgi)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachesafe.settings")
application = get_wsgi_application()
