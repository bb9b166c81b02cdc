"""Rendered pages are reused until the catalog changes, and live pages are never kept."""

from __future__ import annotations

import pytest
from django.test import Client
from pytest_django import DjangoAssertNumQueries
from pytest_django.fixtures import Settings as SettingsWrapper

from registry.models import HubModel
from registry.verdicts import check_in_process, record_check
from tests.dashboard_data import (
    PENDING_REPO,
    TOKENS,
    Catalog,
    build_catalog,
    healthy_service,  # noqa: F401 - a fixture
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("healthy_service")]


@pytest.fixture
def memory_cache(settings: SettingsWrapper) -> None:
    """A process-local cache, so hits cost no query (Redis in production behaves the same)."""
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "t"}
    }
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 60


@pytest.mark.usefixtures("memory_cache")
def test_a_page_is_served_from_the_cache_until_a_check_lands(
    client: Client, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    build_catalog()
    first = client.get("/", {"verdict": "pending"})
    assert first["X-Cache"] == "miss" and PENDING_REPO in first.content.decode()
    with django_assert_num_queries(0):
        second = client.get("/", {"verdict": "pending"})
    assert second["X-Cache"] == "hit" and second.content == first.content
    # The check of the pending model finishes: the same URL now shows the new state.
    version = HubModel.objects.get(repo_id=PENDING_REPO).current_snapshot.default_template  # type: ignore[union-attr]
    record_check(version, check_in_process(version, TOKENS))
    third = client.get("/", {"verdict": "pending"})
    assert third["X-Cache"] == "miss"
    assert PENDING_REPO not in third.content.decode()


@pytest.mark.usefixtures("memory_cache")
def test_htmx_fragments_and_full_pages_are_kept_apart(client: Client) -> None:
    build_catalog()
    page = client.get("/", {"q": "marker"}).content.decode()
    fragment = client.get("/", {"q": "marker"}, headers={"HX-Request": "true"}).content.decode()
    assert "<html" in page and "<html" not in fragment
    again = client.get("/", {"q": "marker"}).content.decode()
    assert "<html" in again


@pytest.mark.usefixtures("memory_cache")
def test_a_check_in_progress_is_never_cached(client: Client) -> None:
    catalog: Catalog = build_catalog()
    url = f"/m/{catalog.pending.repo_id}/"
    first = client.get(url)
    assert first["Cache-Control"] == "no-store" and "X-Cache" not in first
    assert "X-Cache" not in client.get(url)
    # Pinned pages (a template version never changes) are cached.
    sha = catalog.unsafe.current_snapshot.default_template.sha256  # type: ignore[union-attr]
    client.get(f"/t/{sha}/")
    assert client.get(f"/t/{sha}/")["X-Cache"] == "hit"
