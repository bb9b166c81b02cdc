"""The registry's HTML pages: the form that tracks a repo (the dashboard restyles it)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from . import tracking
from .forms import TrackForm
from .models import HubModel


@require_http_methods(["GET", "HEAD", "POST"])
def track_page(request: HttpRequest) -> HttpResponse:
    """GET shows the form and the latest tracked repos; POST tracks one and queues its sync."""
    # Bound on any POST, an empty one too (its errors say what is missing).
    form = TrackForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        if not tracking.may_track(request):
            form.add_error(None, "Too many track requests from your address; try again later.")
        elif form.is_valid():
            model, created = tracking.track(form.cleaned_data["repo_id"], via="form")
            messages.success(
                request,
                f"Now tracking {model.repo_id}; its templates appear after the first sync."
                if created
                else f"{model.repo_id} is already tracked.",
            )
            return redirect(reverse("registry_api:track"))
    recent = HubModel.objects.filter(is_demo=False).order_by("-tracked_at", "-id")[:10]
    status = 429 if form.non_field_errors() else 400 if form.errors else 200
    return render(request, "registry/track.html", {"form": form, "recent": recent}, status=status)
