from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import render

from cachesafe.htmx import HtmxHttpRequest

from .models import HubModel


def catalog(request: HtmxHttpRequest) -> HttpResponse:
    """Every tracked model with its verdict, searchable."""
    query = request.GET.get("q", "")
    models = HubModel.objects.search(query).order_by("-downloads", "repo_id")
    page = Paginator(models, 50).get_page(request.GET.get("page"))
    template = "registry/catalog.html#results" if request.htmx else "registry/catalog.html"
    return render(request, template, {"page": page, "query": query})
