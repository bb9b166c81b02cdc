from __future__ import annotations

from django.urls import URLPattern

app_name = "registry"
# The catalog moved to dashboard/ ("dashboard:catalog").
urlpatterns: list[URLPattern] = []
