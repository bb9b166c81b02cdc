"""The project's URLs plus the trivial view bench_pages.py compares every page with."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import include, path


def trivial(request: HttpRequest) -> HttpResponse:
    """The floor: the same middleware and server, no database, no template."""
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("bench/trivial", trivial),
    path("", include("cachesafe.urls")),
]
