from __future__ import annotations

from django.urls import path

from . import views

app_name = "registry"
urlpatterns = [
    path("", views.catalog, name="catalog"),
]
