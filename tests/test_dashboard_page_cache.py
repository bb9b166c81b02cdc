"""Rendered pages are reused until the catalog changes, and live pages are never kept."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from django.test import Client
from pytest_django import DjangoAssertNumQueries
from pytest_django.fixtures import Settings as SettingsWrapper

from registry.hub import RepoInfo
from registry.models import HubModel
from registry.sync import record_unchanged
from registry.verdicts import check_in_process, record_check
from tests.dashboard_data import (
    PENDING_REPO,
    TOKENS,
    Catalog,
    build_catalog,
    healthy_service,  # noqa: F401 - a fixture
)
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import Sleeps, fake_hub, hub_settings, sleeps

#: pytest-django's `django_capture_on_commit_callbacks`: a test's writes never commit (the test
#: runs in a transaction rolled back at its end); `execute=True` runs what a commit would.
CommitCallbacks = Callable[..., AbstractContextManager[list[Callable[[], Any]]]]

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("healthy_service")]
__all__ = ["fake_hub", "hub_settings", "sleeps"]


@pytest.fixture
def memory_cache(settings: SettingsWrapper) -> None:
    """A process-local cache, so hits cost no query (Redis in production behaves the same)."""
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "t"}
    }
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 60


@pytest.mark.usefixtures("memory_cache")
def test_a_page_is_served_from_the_cache_until_a_check_lands(
    client: Client,
    django_assert_num_queries: DjangoAssertNumQueries,
    django_capture_on_commit_callbacks: CommitCallbacks,
) -> None:
    build_catalog()
    first = client.get("/", {"verdict": "pending"})
    assert first["X-Cache"] == "miss" and PENDING_REPO in first.content.decode()
    with django_assert_num_queries(0):
        second = client.get("/", {"verdict": "pending"})
    assert second["X-Cache"] == "hit" and second.content == first.content
    # The check of the pending model finishes: the same URL now shows the new state.
    version = HubModel.objects.get(repo_id=PENDING_REPO).current_snapshot.default_template  # type: ignore[union-attr]
    with django_capture_on_commit_callbacks(execute=True):  # the check's transaction commits
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


def _info(model: HubModel, **changes: Any) -> RepoInfo:
    """What the Hub says of `model`, as it was last synced, with `changes`."""
    values: dict[str, Any] = {
        "repo_id": model.repo_id,
        "sha": model.last_commit_sha,
        "last_modified": model.last_commit_at,
        "author": model.author,
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": model.downloads,
        "likes": model.likes,
        "tags": model.tags,
        "pipeline_tag": model.pipeline_tag,
        "library_name": model.library_name,
        "base_model": model.base_model,
        "gguf": False,
    }
    return RepoInfo(**(values | changes))


def hits(client: Client, *urls: str) -> list[str]:
    return [client.get(url).get("X-Cache", "live") for url in urls]


@pytest.mark.usefixtures("memory_cache")
def test_an_unchanged_sync_invalidates_no_page(client: Client) -> None:
    catalog = build_catalog()
    model = catalog.unsafe
    urls = ("/", f"/m/{model.repo_id}/", f"/badge/{model.repo_id}.svg", "/api/models")
    assert hits(client, *urls) == ["miss"] * len(urls)
    # Nothing moved upstream but the download counter: the sync writes only quiet fields.
    record_unchanged(model.pk, _info(model, downloads=model.downloads + 7))
    assert HubModel.objects.get(pk=model.pk).downloads == model.downloads + 7
    assert hits(client, *urls) == ["hit"] * len(urls)


@pytest.mark.usefixtures("memory_cache")
def test_a_new_verdict_invalidates_that_models_pages_and_the_listings_only(
    client: Client, django_capture_on_commit_callbacks: CommitCallbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):  # the catalog was committed before
        catalog = build_catalog()
    pending = HubModel.objects.get(repo_id=PENDING_REPO)
    version = pending.current_snapshot.default_template  # type: ignore[union-attr]
    safe = catalog.safe
    safe_sha = safe.current_snapshot.default_template.sha256  # type: ignore[union-attr]
    others = (f"/m/{safe.repo_id}/", f"/t/{safe_sha}/", f"/badge/{safe.repo_id}.svg")
    touched = (f"/m/{PENDING_REPO}/", f"/t/{version.sha256}/", "/", "/api/models")
    hits(client, *others, *touched)
    # While its check runs, the pending model's page is live (never kept); the rest are kept.
    assert hits(client, *others, *touched) == ["hit"] * 3 + ["live"] + ["hit"] * 3
    with django_capture_on_commit_callbacks(execute=True):
        record_check(version, check_in_process(version, TOKENS))  # the pending model's verdict
    assert hits(client, *others) == ["hit"] * 3
    assert hits(client, *touched) == ["miss"] * 4
    assert hits(client, *touched) == ["hit"] * 4
    assert "Not checked yet" not in client.get(f"/m/{PENDING_REPO}/").content.decode()


@pytest.mark.usefixtures("memory_cache")
def test_a_new_verdict_leaves_the_listings_that_neither_show_it_nor_filter_by_verdict(
    client: Client, django_capture_on_commit_callbacks: CommitCallbacks
) -> None:
    """A listing is rebuilt for a new verdict when it shows that model, or when its filters or
    order read verdicts (the model may move in or out); a search that does not show it stays
    a hit, page and API alike."""
    with django_capture_on_commit_callbacks(execute=True):
        catalog = build_catalog()
    version = catalog.pending.current_snapshot.default_template  # type: ignore[union-attr]
    term = catalog.safe.repo_id.split("/")[1]
    elsewhere = (f"/?q={term}", f"/api/models?q={term}", f"/?q={term}&sort=name")
    moved = ("/", "/?verdict=pending", "/?sort=reuse", "/?client=reasoning_content", "/api/models")
    assert PENDING_REPO not in client.get(elsewhere[0]).content.decode()
    hits(client, *elsewhere, *moved)
    assert hits(client, *elsewhere, *moved) == ["hit"] * 8
    with django_capture_on_commit_callbacks(execute=True):
        record_check(version, check_in_process(version, TOKENS))  # the pending model's verdict
    assert hits(client, *elsewhere) == ["hit"] * 3
    assert hits(client, *moved) == ["miss"] * 5
    assert PENDING_REPO not in client.get("/?verdict=pending").content.decode()


@pytest.mark.usefixtures("memory_cache")
def test_a_listing_is_rebuilt_when_a_model_it_shows_changes_in_any_way(
    client: Client, django_capture_on_commit_callbacks: CommitCallbacks
) -> None:
    """A probe result changes only its model's scope: the listings showing that model move on
    with it (before, only a write to the listings did)."""
    from dashboard import page_cache

    with django_capture_on_commit_callbacks(execute=True):
        catalog = build_catalog()
    term = catalog.safe.repo_id.split("/")[1]
    shows_it, other = f"/?q={term}", f"/?q={catalog.unsafe.repo_id.split('/')[1]}"
    hits(client, shows_it, other)
    page_cache.bump(page_cache.model_scope(catalog.safe.repo_id))
    assert hits(client, shows_it, other) == ["miss", "hit"]


@pytest.mark.usefixtures("memory_cache")
def test_a_write_that_lands_while_a_listing_renders_is_not_missed(
    client: Client, django_capture_on_commit_callbacks: CommitCallbacks
) -> None:
    """The models a listing shows are known only once it has read its rows; a write to one of
    them that lands after the read but before the copy is kept must still make that copy
    old (the copy counts from when its render began, not from when it was kept)."""
    from django.db import connection

    from dashboard import page_cache

    with django_capture_on_commit_callbacks(execute=True):
        catalog = build_catalog()
    url = f"/?q={catalog.safe.repo_id.split('/')[1]}"
    landed: list[bool] = []

    def writer_lands_during_the_render(execute: Any, *args: Any) -> Any:
        result = execute(*args)
        if not landed:  # once the page has read something: another process's commit
            landed.append(True)
            page_cache.bump(page_cache.model_scope(catalog.safe.repo_id))
        return result

    with connection.execute_wrapper(writer_lands_during_the_render):
        assert client.get(url)["X-Cache"] == "miss"
    assert landed
    assert hits(client, url, url) == ["miss", "hit"]


def test_a_listing_that_does_not_say_what_it_shows_depends_on_every_verdict() -> None:
    from django.test import RequestFactory

    from dashboard.page_cache import ALL, LISTINGS, VERDICTS, _shown, model_scope, shows

    request = RequestFactory().get("/")
    assert _shown(request, [ALL, LISTINGS]) == [VERDICTS]
    assert _shown(request, [ALL, model_scope("a/b")]) == []
    shows(request, ["A/B"], reads_verdicts=False)
    assert _shown(request, [ALL, LISTINGS]) == [model_scope("a/b")]
    shows(request, ["A/B"], reads_verdicts=True)
    assert _shown(request, [ALL, LISTINGS]) == [model_scope("a/b"), VERDICTS]


@pytest.mark.usefixtures("memory_cache")
def test_a_deleted_model_drops_every_page(
    client: Client, django_capture_on_commit_callbacks: CommitCallbacks
) -> None:
    catalog = build_catalog()
    url = f"/m/{catalog.safe.repo_id}/"
    hits(client, url, "/")
    with django_capture_on_commit_callbacks(execute=True):
        HubModel.objects.filter(repo_id=PENDING_REPO).delete()
    assert hits(client, url, "/") == ["miss", "miss"]


@pytest.mark.usefixtures("memory_cache")
def test_while_one_request_rebuilds_a_page_the_others_get_the_old_copy(
    client: Client, django_capture_on_commit_callbacks: CommitCallbacks
) -> None:
    from django.core.cache import cache
    from django.test import RequestFactory

    from dashboard import page_cache

    build_catalog()
    first = client.get("/", {"verdict": "pending"})
    assert first["X-Cache"] == "miss" and PENDING_REPO in first.content.decode()
    version = HubModel.objects.get(repo_id=PENDING_REPO).current_snapshot.default_template  # type: ignore[union-attr]
    with django_capture_on_commit_callbacks(execute=True):
        record_check(version, check_in_process(version, TOKENS))
    # Another process has started rebuilding this page: this one serves the copy it has.
    key = page_cache._key(RequestFactory().get("/", {"verdict": "pending"}), page_cache._banners())
    assert cache.add(f"{key}:rebuild", 1, 10)
    stale = client.get("/", {"verdict": "pending"})
    assert stale["X-Cache"] == "stale" and stale.content == first.content
    cache.delete(f"{key}:rebuild")  # that rebuild ended without keeping a page (say it failed)
    fresh = client.get("/", {"verdict": "pending"})
    assert fresh["X-Cache"] == "miss" and PENDING_REPO not in fresh.content.decode()
    assert client.get("/", {"verdict": "pending"})["X-Cache"] == "hit"


@pytest.mark.skipif(
    not os.environ.get("REDIS_URL"),
    reason="Redis outlives a test; the embedded cache is a table of the test's transaction",
)
def test_no_test_is_served_the_copy_of_a_page_whose_render_raised(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A render that raises keeps its page's rebuild lock for the lock's life, and meanwhile
    the page's copy is served however old (in production, better than an error for each
    reader). Between tests it served a copy an earlier test (or run) rendered: each test
    starts with no lock held (tests/conftest.py)."""
    from dashboard import catalog, page_cache
    from tests.conftest import release_page_locks

    def broken(*args: object) -> None:
        raise RuntimeError("the render raised")

    build_catalog()
    assert client.get("/")["X-Cache"] == "miss"
    page_cache.bump(page_cache.ALL)
    with monkeypatch.context() as patched, pytest.raises(RuntimeError, match="render raised"):
        patched.setattr(catalog.CappedPaginator, "get_page", broken)
        client.get("/")
    HubModel.objects.create(repo_id="late/arrival", author="late", downloads=10**9)
    page_cache.bump(page_cache.ALL)
    stale = client.get("/")
    assert stale["X-Cache"] == "stale" and "late/arrival" not in stale.content.decode()
    release_page_locks()
    fresh = client.get("/")
    assert fresh["X-Cache"] == "miss" and "late/arrival" in fresh.content.decode()


def test_a_copy_newer_than_this_process_knows_is_fresh() -> None:
    """Another process rendered after a write this one has not read yet: serve it, don't
    render it again (and overwrite it with an older copy)."""
    from dashboard.page_cache import _up_to_date

    assert _up_to_date(["5", "7"], ["5", "6"])
    assert _up_to_date(["5", "7"], ["5", "7"])
    assert not _up_to_date(["5", "6"], ["5", "7"])
    assert not _up_to_date(["5"], ["5", "7"])  # another page shape: never the same entry


@pytest.mark.usefixtures("memory_cache")
def test_a_transaction_moves_its_pages_on_once_at_commit(
    client: Client,
    django_capture_on_commit_callbacks: CommitCallbacks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync saves a model and several parts of it in one transaction: their scopes go to the
    cache together, after the commit; a page read before the commit is still the old copy."""
    from django.db import transaction

    from dashboard import page_cache

    with django_capture_on_commit_callbacks(execute=True):
        catalog = build_catalog()
    model = catalog.unsafe
    url = f"/m/{model.repo_id}/"
    assert hits(client, url, "/") == ["miss", "miss"]
    bumped: list[tuple[str, ...]] = []
    real_bump = page_cache.bump

    def counted_bump(*scopes: str) -> None:
        bumped.append(scopes)
        real_bump(*scopes)

    monkeypatch.setattr(page_cache, "bump", counted_bump)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        model.pipeline_tag = "text-generation"
        model.save()
        model.library_name = "mlx"
        model.save(update_fields=["library_name"])
        HubModel.objects.filter(pk=catalog.safe.pk).get().save()
        assert hits(client, url, "/") == ["hit", "hit"]  # not committed: nothing moved on
        assert bumped == []
    assert len(bumped) == 1  # one round trip for the whole transaction
    assert {page_cache.model_scope(model.repo_id), page_cache.LISTINGS} <= set(bumped[0])
    assert page_cache.model_scope(catalog.safe.repo_id) in bumped[0]
    assert hits(client, url, "/") == ["miss", "miss"]


@pytest.mark.usefixtures("memory_cache")
def test_a_change_to_any_model_drops_every_page(
    client: Client, django_capture_on_commit_callbacks: CommitCallbacks
) -> None:
    """`catalog_changed` without model ids means any model may have changed."""
    from registry.signals import catalog_changed

    with django_capture_on_commit_callbacks(execute=True):
        catalog = build_catalog()
    urls = (f"/m/{catalog.safe.repo_id}/", "/")
    assert hits(client, *urls) == ["miss", "miss"]
    with django_capture_on_commit_callbacks(execute=True):
        catalog_changed.send(sender=HubModel, model_ids=None)
    assert hits(client, *urls) == ["miss", "miss"]


def test_a_sync_gives_the_scopes_it_moved_on_without_a_lookup(
    fake_hub: FakeHub,
    hub_settings: Any,
    sleeps: Sleeps,
    django_capture_on_commit_callbacks: CommitCallbacks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync that records templates has the model's and its templates' scopes at hand: it
    gives them (`catalog_changed`'s `shown`), so its commit looks nothing up, and the pages
    that move on are the ones a lookup finds."""
    from dashboard import page_cache
    from registry.hub import HubClient
    from registry.sync import RegistrySync

    named = {"default": b"{{ messages }}", "tool_use": b"{{ tools }}{{ messages }}"}
    fake_hub.store.create_repo("acme/scoped")
    fake_hub.store.add_commit(
        "acme/scoped", {"tokenizer_config.json": tokenizer_config(None, None, None, named)}
    )
    model, _ = HubModel.objects.track("acme/scoped", via="track")
    real_lookup = page_cache._scopes_of_models
    looked_up: list[dict[int, bool]] = []
    bumped: list[set[str]] = []
    monkeypatch.setattr(page_cache, "bump", lambda *scopes: bumped.append(set(scopes)))

    def counted_lookup(models: dict[int, bool]) -> list[str]:
        looked_up.append(dict(models))
        return real_lookup(models)

    monkeypatch.setattr(page_cache, "_scopes_of_models", counted_lookup)
    with django_capture_on_commit_callbacks(execute=True):
        RegistrySync(HubClient(sleep=sleeps, clock=sleeps.clock, timeout=2)).sync(model)

    assert looked_up == []
    found = set(real_lookup({model.pk: True}))  # what a lookup finds now
    assert len(found) == 3  # the model, and its two templates
    assert bumped == [found | {page_cache.LISTINGS}]

    # A later write that does not say what it shows is looked up again.
    with django_capture_on_commit_callbacks(execute=True):
        page_cache.bump_on_commit(models=[model.pk], known={model.pk: ["model:stale"]})
        page_cache.bump_on_commit(models=[model.pk], templates=True)
    assert looked_up == [{model.pk: True}]
    assert bumped[-1] == found


@pytest.mark.usefixtures("memory_cache")
def test_a_banner_is_never_served_from_a_copy_made_before_or_after_it(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status banner is part of the page: a copy rendered while the worker had not
    reported yet is not served once it has, and a copy without the banner is not served
    while the banner is up."""
    from cachesafe import context_processors
    from dashboard import page_cache
    from workers.health import Component, ServiceStatus

    build_catalog()
    ok = Component(True, "ok")
    down = ServiceStatus(ok, ok, Component(False, "Worker has never reported"), ok, ok)
    monkeypatch.setattr(context_processors, "cached_status", lambda: down)
    monkeypatch.setattr(page_cache, "cached_status", lambda: down)
    early = client.get("/", {"q": "marker"})
    assert early["X-Cache"] == "miss" and "Worker has never reported" in early.content.decode()
    healthy = ServiceStatus(ok, ok, ok, ok, ok)
    monkeypatch.setattr(context_processors, "cached_status", lambda: healthy)
    monkeypatch.setattr(page_cache, "cached_status", lambda: healthy)
    later = client.get("/", {"q": "marker"})
    assert later["X-Cache"] == "miss" and "Worker has never reported" not in later.content.decode()
    assert client.get("/", {"q": "marker"})["X-Cache"] == "hit"
    monkeypatch.setattr(context_processors, "cached_status", lambda: down)
    monkeypatch.setattr(page_cache, "cached_status", lambda: down)
    again = client.get("/", {"q": "marker"})
    assert again["X-Cache"] == "hit" and "Worker has never reported" in again.content.decode()
