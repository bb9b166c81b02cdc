"""Small promises of the pages: HEAD works, fragments never stand in for pages, an icon, admin."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.dashboard_data import Catalog, build_catalog, healthy_service  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


def test_head_works_wherever_get_does(client: Client, catalog: Catalog) -> None:
    """Pages and the JSON API alike (its routes are GET routes: a HEAD was a 405)."""
    sha = catalog.old_version.sha256
    api = ("/api/", "/api/models", f"/api/models/{catalog.unsafe.repo_id}", "/api/probes",
           f"/api/templates/{sha}", "/api/openapi.json", "/api/models/no/such-model")  # fmt: skip
    for path in ("/", f"/m/{catalog.unsafe.repo_id}/", "/probes/", "/alerts/login/", "/healthz",
                 *api):  # fmt: skip
        head, get = client.head(path), client.get(path)
        assert head.status_code == get.status_code != 405, path
        assert head.content == b"" and head["Content-Length"] == str(len(get.content)), path
        assert head["Content-Type"] == get["Content-Type"], path


def allowed(response: Any) -> set[str]:
    assert response.status_code == 405, response.status_code
    return {method.strip() for method in response["Allow"].split(",")}


def test_a_405_lists_head_wherever_get_is_allowed(client: Client, catalog: Catalog) -> None:
    """The API's routes answer HEAD (as the GET it stands for), but their 405 said
    `Allow: GET`; the alerts links that take GET and POST refused HEAD itself. A route that
    answers GET answers HEAD, and a 405 says so."""
    for path in ("/", f"/badge/{catalog.unsafe.repo_id}.svg", "/api/probes", "/api/"):
        assert allowed(client.post(path)) == {"GET", "HEAD"}, path
        assert client.head(path).status_code == client.get(path).status_code == 200, path
    assert allowed(client.delete("/api/models")) == {"GET", "HEAD", "POST"}
    # The feeds and the track form answered any method (a PUT with the feed, a DELETE with
    # the form).
    feeds = ("/feeds/changes.atom", f"/m/{catalog.unsafe.repo_id}/changes.atom")
    for path in (*feeds, f"/feeds/authors/{catalog.unsafe.author}.atom"):
        assert allowed(client.put(path)) == {"GET", "HEAD"}, path
        assert client.head(path).status_code == 200, path
    assert allowed(client.delete("/track/")) == {"GET", "HEAD", "POST"}
    # POST-only routes list no GET, and no HEAD with it.
    assert allowed(client.get("/hooks/hub")) == {"POST"}
    assert allowed(client.head("/discovery/run")) == {"POST"}
    # GET shows a confirm form, POST acts: HEAD is answered as GET is (here a bad link's 400).
    for path in ("/alerts/confirm/no-such-token/", "/alerts/unsubscribe/no-such-token/"):
        head, get = client.head(path), client.get(path)
        assert head.status_code == get.status_code == 400, path
        assert head.content == b"" and head["Content-Length"] == str(len(get.content)), path
        assert allowed(client.put(path)) == {"GET", "HEAD", "POST"}, path


def test_a_page_and_its_htmx_fragment_vary_on_hx_request(client: Client, catalog: Catalog) -> None:
    """Back after a search must show the page, not a cached bare fragment of the same URL."""
    page = client.get("/?q=chatml")
    fragment = client.get("/?q=chatml", headers={"HX-Request": "true"})
    assert "<html" in page.content.decode() and "<html" not in fragment.content.decode()
    for response in (page, fragment):
        assert "HX-Request" in response["Vary"]


def test_the_favicon_is_linked_and_served(client: Client, catalog: Catalog) -> None:
    assert 'rel="icon"' in client.get("/").content.decode()
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")


def test_the_admin_lists_the_registry(client: Client, catalog: Catalog) -> None:
    User.objects.create_superuser("root", password="pw")
    client.login(username="root", password="pw")
    for name in (
        "hubmodel",
        "templateversion",
        "checkrun",
        "modelevent",
        "proberun",
        "outboxmessage",
    ):
        response = client.get(f"/admin/registry/{name}/")
        assert response.status_code == 200, name
    assert catalog.unsafe.repo_id in client.get("/admin/registry/hubmodel/").content.decode()


def test_an_unknown_filter_value_is_shown_as_ignored(client: Client, catalog: Catalog) -> None:
    body = client.get("/?verdict=bogus&tools=safe").content.decode()
    assert "Ignored verdict=bogus: not a value this filter knows." in body
    assert "tools=safe" not in body.split("Ignored", 1)[1].split("</p>", 1)[0]
    assert "Ignored" not in client.get("/?verdict=safe").content.decode()


def test_healthz_503_while_starting_is_logged_at_info(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cachesafe import views
    from workers.health import Component, ServiceStatus

    down = Component(False, "beat scheduler has never ticked")
    up = Component(True, "ok")
    monkeypatch.setattr(views, "service_status", lambda: ServiceStatus(up, up, up, down, down))
    with caplog.at_level("INFO", logger="django.request"):
        assert client.get("/healthz").status_code == 503
    [record] = [r for r in caplog.records if r.name == "django.request"]
    assert record.levelname == "INFO"


def test_the_api_has_an_index_and_the_nav_opens_its_docs(client: Client, catalog: Catalog) -> None:
    index = client.get("/api/").json()
    assert index["docs"].endswith("/api/docs") and index["openapi"].endswith("/api/openapi.json")
    listed = {(op["method"], op["path"]) for op in index["operations"]}
    assert {("GET", "/api/models"), ("POST", "/api/models"), ("POST", "/hooks/hub")} <= listed
    assert 'href="/api/docs">API</a>' in client.get("/").content.decode()
    assert client.get("/api/docs").status_code == 200
