"""The registry's pages: the track form. Its JSON API is in dashboard/api.py."""

from __future__ import annotations

from django.urls import path

from . import pages

# "registry_api" is the namespace templates/registry/track.html and pages.py reverse.
app_name = "registry_api"
urlpatterns = [
    path("track/", pages.track_page, name="track"),
]
