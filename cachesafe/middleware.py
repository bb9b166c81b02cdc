"""Request hardening that every page and API path shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

from registry.rate_limits import RateLimitUnavailable

Handler = Callable[[HttpRequest], HttpResponse]


def _without_nul(params: QueryDict) -> Any:
    cleaned = QueryDict(mutable=True)
    for key, values in params.lists():
        cleaned.setlist(key.replace("\x00", ""), [v.replace("\x00", "") for v in values])
    cleaned._mutable = False  # what Django hands views: read-only
    return cleaned


class HeadWithoutBodyMiddleware:
    """A HEAD is answered with GET's headers (its Content-Length too) and no body. Django's
    views write the body for HEAD as for GET; its development server and test client drop
    it, gunicorn drops it with a warning in the log for each request (uptime checkers send
    HEAD every few seconds). Outermost, so the headers are final when the body goes.

    Every route that answers GET answers HEAD: a HEAD is served as the GET it stands for
    (Django's own views do the same, `View.head = View.get`), then its body dropped here. The
    JSON API's routes are declared for GET alone (django-ninja answered a HEAD with 405), and
    so are the alerts links that take GET and POST (`require_http_methods`). A 405 that allows
    GET therefore lists HEAD in its `Allow` too, as it would have to say."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "HEAD":
            request.method = "GET"
            try:
                response = self.get_response(request)
            finally:
                request.method = "HEAD"
        else:
            response = self.get_response(request)
        if response.status_code == 405:
            allowed = [m.strip() for m in response.get("Allow", "").split(",") if m.strip()]
            if "GET" in allowed and "HEAD" not in allowed:
                response["Allow"] = ", ".join([*allowed, "HEAD"])
        if request.method == "HEAD" and isinstance(response, StreamingHttpResponse):
            # A file (WhiteNoise's static files) has its Content-Length; it is closed with
            # the answer, unread.
            response.streaming_content = ()
        elif request.method == "HEAD":
            if not response.has_header("Content-Length"):
                response["Content-Length"] = str(len(response.content))
            response.content = b""
        return response


class QueryTextMiddleware:
    """Query strings reach database lookups (search terms, `?model=`); PostgreSQL refuses a NUL
    character in text, so NULs are dropped here and a crafted link answers a page, not a 500."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.GET.urlencode() or "%00" in request.META.get("QUERY_STRING", ""):
            request.GET = _without_nul(request.GET)
        return self.get_response(request)


class HtmxVaryMiddleware:
    """A page and its htmx fragment share a URL: say that the answer depends on `HX-Request`,
    so a browser's Back never shows a cached bare fragment in place of the page."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html"):
            patch_vary_headers(response, ("HX-Request",))
        return response


def is_api_path(path: str) -> bool:
    return path.startswith(("/api/", "/hooks/")) or path == "/api"


class ServiceUnavailableMiddleware:
    """A shared service that is down for a moment (the cache behind the rate limits) is a 503
    with `Retry-After`, in JSON on API paths and as a page elsewhere; never a 500."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not isinstance(exc, RateLimitUnavailable):
            return None
        message = "This service is briefly unavailable (its cache cannot be reached); try again."
        response: HttpResponse
        if is_api_path(request.path):
            response = JsonResponse(
                {"error": {"code": "service_unavailable", "message": message}}, status=503
            )
        else:
            response = render(request, "503.html", {"message": message}, status=503)
        response["Retry-After"] = str(exc.retry_after)
        return response
