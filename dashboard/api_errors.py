"""Every error of the JSON API in one shape, `{"error": {"code": …, "message": …}}`, whatever
raised it: a view, ninja's validation, a method a route does not take, a body refused before it
is read, a service that is down. Never HTML and never a traceback, even with DEBUG on.

Bodies are bounded before they cost anything: the Content-Type is checked first (only
`application/json`), then the declared length (the body is not read when it is too long), then
the JSON nesting (a deep document is refused instead of recursing).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, ValidationError
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.response import HttpResponseBase
from ninja.errors import HttpError, Throttled
from ninja.errors import ValidationError as RequestInvalid
from ninja.parser import Parser

from registry.rate_limits import RateLimitUnavailable

logger = logging.getLogger(__name__)

#: Seconds a client should wait after a 503 (database, cache or broker unreachable).
RETRY_AFTER_UNAVAILABLE = 30
#: Objects and arrays a JSON body may nest; no request of ours needs more than a few.
MAX_JSON_DEPTH = 32

CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    500: "internal_error",
    503: "service_unavailable",
}
# A service we depend on did not answer: the request may well succeed later (503), unlike a bug.
UNAVAILABLE = (
    OperationalError,
    InterfaceError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ConnectionError,
)

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


class ApiError(HttpError):
    """An answer other than success, with its stable `code` (by status unless given)."""

    def __init__(
        self, status: int, message: str, *, code: str = "", retry_after: int | None = None
    ) -> None:
        super().__init__(status, message)
        self.code = code or CODES.get(status, "error")
        self.retry_after = retry_after


def error_response(
    status: int, message: str, *, code: str = "", retry_after: int | None = None
) -> JsonResponse:
    response = JsonResponse(
        {"error": {"code": code or CODES.get(status, "error"), "message": message}}, status=status
    )
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _validation_message(errors: list[dict[str, Any]]) -> str:
    """Ninja's errors in one line: `query.page: Input should be …; body.repo_id: …`."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'is not valid')}")
    return "; ".join(parts) or "the request is not valid"


def response_for(exc: BaseException) -> JsonResponse:
    """The error answer for whatever went wrong while serving an API request."""
    if isinstance(exc, HttpError) and isinstance(exc.__cause__, ApiError):
        exc = exc.__cause__  # ninja wraps what the body parser raises; ours says more
    if isinstance(exc, ApiError):
        return error_response(
            exc.status_code, exc.message, code=exc.code, retry_after=exc.retry_after
        )
    if isinstance(exc, Throttled):
        wait = math.ceil(exc.wait) if exc.wait is not None else None
        return error_response(429, "too many requests; try again later", retry_after=wait)
    if isinstance(exc, HttpError):
        return error_response(exc.status_code, exc.message)
    if isinstance(exc, RequestInvalid):
        return error_response(400, _validation_message(exc.errors))
    if isinstance(exc, ValidationError):  # the registry refusing a value (validate_repo_id)
        return error_response(400, "; ".join(exc.messages))
    if isinstance(exc, Http404):
        return error_response(404, "not found")
    if isinstance(exc, RequestDataTooBig):
        return error_response(413, "the request body is too large")
    if isinstance(exc, SuspiciousOperation | UnreadablePostError):
        return error_response(400, "the request could not be read")
    if isinstance(exc, RateLimitUnavailable) or _caused_by_outage(exc):
        logger.warning("API request failed, a service is unavailable: %r", exc)
        return error_response(
            503,
            "a service this request needs is unavailable; try again shortly",
            retry_after=getattr(exc, "retry_after", RETRY_AFTER_UNAVAILABLE),
        )
    if isinstance(exc, DataError):
        # Input validation should have refused the value; the database did instead.
        logger.warning("API request refused by the database: %r", exc)
        return error_response(400, "a value in this request cannot be stored or searched")
    logger.error("API request failed", exc_info=exc)
    return error_response(500, "internal error")


def _caused_by_outage(exc: BaseException | None) -> bool:
    """True when `exc`, or what it was raised from, is a service that did not answer."""
    seen = 0
    while exc is not None and seen < 10:  # a chain is short; a cycle must not hang us
        if isinstance(exc, UNAVAILABLE) or _broker_outage(exc):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def _broker_outage(exc: BaseException) -> bool:
    """The broker's client (kombu) could not connect. Its class is looked up only where kombu
    is loaded (an exception of it cannot exist anywhere else): a web process that sends no task
    never imports it, nor Celery."""
    kombu_exceptions = sys.modules.get("kombu.exceptions")
    return kombu_exceptions is not None and isinstance(exc, kombu_exceptions.OperationalError)


def _is_json(response: HttpResponseBase) -> bool:
    return str(response.get("Content-Type", "")).startswith("application/json")


def json_errors(view: View) -> View:
    """The API's URL-level net: an exception, or an error answer from outside our handlers
    (ninja's 405 for a method a route does not take is plain text), becomes a JSON error."""

    @functools.wraps(view)  # keeps ninja's csrf_exempt: API clients send no CSRF token
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            response = view(request, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure answers in the API's shape
            return response_for(exc)
        if response.status_code < 400 or _is_json(response):
            return response
        status = response.status_code
        message = f"{request.method} is not allowed here" if status == 405 else "request failed"
        replaced = error_response(status, message)
        for header in ("Allow", "Retry-After"):
            if header in response:
                replaced[header] = response[header]
        return replaced

    return wrapper  # type: ignore[return-value]


def json_body(max_bytes: int) -> Callable[[View], View]:
    """Wraps an operation's run (`ninja.decorators.decorate_view`), before ninja reads the body:
    415 unless it is `application/json`, 413 when its declared length is over `max_bytes`.

    Requiring application/json is also what keeps a cross-site form from posting to the API:
    a browser sends that type cross-site only after a CORS preflight, which we never grant.
    """

    def decorate(run: View) -> View:
        @functools.wraps(run)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if (request.content_type or "").lower() != "application/json":
                return error_response(
                    415, "send the body as JSON, with Content-Type: application/json"
                )
            if _declared_length(request) > max_bytes:
                return error_response(413, f"the body is over {max_bytes} bytes")
            return run(request, *args, **kwargs)

        return guarded  # type: ignore[return-value]

    return decorate


def _declared_length(request: HttpRequest) -> int:
    # As Django reads it: the body it will read is never longer than CONTENT_LENGTH.
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when objects and arrays nest more than `limit` levels (without recursing)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


class JsonParser(Parser):
    """Ninja's body parser, with answers that say what was wrong (ninja wraps what this raises
    in its own 400; `response_for` unwraps it)."""

    def parse_body(self, request: HttpRequest) -> Any:
        try:
            data = json.loads(request.body)
        except RecursionError:
            data = None
            deep = True
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"expected a JSON body ({exc})", code="invalid_json") from exc
        else:
            deep = isinstance(data, dict | list) and too_deep(data)
        if deep:
            raise ApiError(
                400, f"the JSON nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json"
            )
        return data


def unknown_path(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Any other path under /api/ or /hooks/: a JSON 404 rather than the site's HTML page."""
    return error_response(404, f"no such API path: {request.path}")
