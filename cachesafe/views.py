from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from workers.health import service_status


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """200 only when the database, the broker, a worker and beat are all alive."""
    status = service_status()
    return JsonResponse(status.as_json(), status=200 if status.healthy else 503)


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page links: send them to the real icon."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))
