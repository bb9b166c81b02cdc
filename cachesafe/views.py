from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from workers.health import service_status


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 only when the database, the broker, a worker and beat are all alive."""
    status = service_status()
    return JsonResponse(status.as_json(), status=200 if status.healthy else 503)
