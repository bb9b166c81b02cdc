"""The registry's endpoints, included at the root before the dashboard's (see api.py)."""

from __future__ import annotations

from django.urls import path

from . import api, pages

app_name = "registry_api"
urlpatterns = [
    path("api/models", api.models_collection, name="models"),
    path("api/models/<str:org>/<str:name>", api.model_detail, name="model"),
    path("hooks/hub", api.hub_webhook, name="hub_webhook"),
    path("track/", pages.track_page, name="track"),
]
