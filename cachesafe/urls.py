from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("admin/", admin.site.urls),
    path("", include("registry.urls")),
    path("", include("dashboard.urls")),
    path("alerts/", include("alerts.urls")),
]
