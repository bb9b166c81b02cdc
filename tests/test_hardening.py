"""Bad input and a missing cache never make a page answer 500; the banner never waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from registry import rate_limits
from tests.dashboard_data import Catalog, build_catalog, healthy_service  # noqa: F401
from workers import health

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


def sha(catalog: Catalog) -> str:
    assert catalog.unsafe.current_snapshot is not None
    return catalog.unsafe.current_snapshot.default_template.sha256


@pytest.mark.parametrize(
    "path",
    [
        "/?q=qwen%00",
        "/?q=%00&author=org%00",
        "/?verdict=safe%00",
        "/feeds/changes.atom?q=%00",
    ],
)
def test_a_nul_byte_in_a_query_string_answers_the_page(
    client: Client, catalog: Catalog, path: str
) -> None:
    # PostgreSQL refuses NUL in text: without the cleaning this is a DataError and a 500.
    assert client.get(path).status_code == 200


def test_a_nul_byte_in_the_pair_page_model_parameter(client: Client, catalog: Catalog) -> None:
    url = f"/t/{sha(catalog)}/pair/default/chat/1/?model={catalog.unsafe.repo_id}%00"
    assert client.get(url).status_code in (200, 404)


class DownCache:
    """A cache whose every call fails as Redis does when it is gone."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

        return fail


def test_rate_limits_without_their_cache_answer_503_with_retry_after(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rate_limits, "cache", DownCache())
    page = client.post("/track/", {"repo_id": "org/model"})
    assert page.status_code == 503 and page["Retry-After"] == "30"
    assert "Briefly unavailable" in page.content.decode()
    api = client.post("/api/models", {"repo_id": "org/model"}, content_type="application/json")
    assert api.status_code == 503 and api["Retry-After"] == "30"
    assert api["Content-Type"].startswith("application/json")


def slow_status_check(
    monkeypatch: pytest.MonkeyPatch, answer: health.ServiceStatus
) -> tuple[threading.Event, threading.Event]:
    """A status check that answers `answer` once released, as one with the broker down
    answers after its timeout: (asked, release)."""
    asked, release = threading.Event(), threading.Event()

    def slow_status() -> Any:
        asked.set()
        release.wait(10)
        return answer

    monkeypatch.setattr(health, "service_status", slow_status)
    return asked, release


def page_status() -> list[Any]:
    """What a page's banner gets, asked from a thread of its own, if within 5 s."""
    answered: list[Any] = []
    page = threading.Thread(target=lambda: answered.append(health.cached_status()))
    page.start()
    page.join(5)
    return answered


def test_a_worker_asks_for_the_status_as_it_starts_and_no_page_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`refresh_soon` (gunicorn's `post_fork`) starts the first check in the background; the
    pages served while it runs show no banner rather than wait for it, and the answer is
    kept once it comes."""
    answer = health.ServiceStatus(*(health.Component(False, "broker unreachable: timed out"),) * 5)
    asked, release = slow_status_check(monkeypatch, answer)
    monkeypatch.setattr(health, "_cached", None)
    monkeypatch.setattr(health, "_refreshing", False)
    health.refresh_soon()
    try:
        assert asked.wait(5), "the first check did not start"
        assert page_status() == [health.NOT_YET], "a page waited for the first check"
        assert health.NOT_YET.problems == []  # no banner while nothing is known
        health.refresh_soon()  # a second call while one runs starts nothing
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while health._refreshing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert health.cached_status() is answer
    assert health.cached_status().problems  # the banner shows what the check found


def test_the_banner_serves_a_stale_status_while_a_slow_check_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the broker down, asking for the status takes its timeout: no page may wait."""
    first = health.cached_status()
    asked, release = slow_status_check(monkeypatch, first)
    monkeypatch.setattr(health, "_cached", (0.0, first))  # long stale
    answered = page_status()
    try:
        assert answered == [first], "a page waited for the status check"
        assert asked.wait(5), "the stale status was not refreshed in the background"
    finally:
        release.set()


@pytest.mark.parametrize(
    ("path", "answer"),
    [
        ("/", "200 OK"),
        ("/api/probes", "200 OK"),  # a GET route to django-ninja
        ("/alerts/confirm/no-such-token/", "400 Bad Request"),  # a GET and POST route
        ("/static/favicon.svg", "200 OK"),  # WhiteNoise's file, streamed
    ],
)
def test_a_head_gets_the_headers_of_a_get_and_no_body(
    catalog: Catalog, path: str, answer: str
) -> None:
    """Through the WSGI handler as a server calls it (the test client drops a HEAD's body
    itself, so it would hide a body sent): no body bytes, GET's Content-Length."""
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections
    from django.test import RequestFactory

    def call(method: str) -> tuple[str, dict[str, str], bytes]:
        answered: dict[str, Any] = {}

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            answered["status"], answered["headers"] = status, dict(headers)
            return lambda data: None

        environ = RequestFactory().generic(method, path).environ
        # As the test client does: the test's transaction must outlive the request.
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            response = WSGIHandler()(environ, start_response)
            body = b"".join(response)
            response.close()
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)
        return answered["status"], answered["headers"], body

    status, headers, body = call("HEAD")
    got_status, got_headers, got_body = call("GET")
    assert status == got_status == answer
    assert body == b"" and got_body
    assert headers["Content-Length"] == str(len(got_body))
