"""Sync status in plain words: the mapping of what the sync writes, the model page's status line,
the staff "Retry now" button, and the site banner while the Hub cannot be reached."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries

from dashboard import status as page_status
from registry.hub import HubClient, HubUnavailable
from registry.models import HubModel, ModelStatus
from registry.sync import RegistrySync, record_failure, record_unavailable
from registry.sync_status import (
    Problem,
    describe,
    explain_status,
    explain_sync_error,
    hub_unreachable,
)
from tests.conftest import free_port
from tests.dashboard_data import add_model, healthy_service  # noqa: F401 - a fixture
from tests.fakehub import FakeHub
from tests.fakehub.fixtures import Sleeps, fake_hub, hub_settings, sleeps

pytestmark = pytest.mark.django_db
__all__ = ["fake_hub", "hub_settings", "sleeps"]

BANNER = "The Hugging Face Hub cannot be reached from this server"
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
# What `HubClient._call` wrote in the user test (DNS down), as `record_failure` stores it.
DNS_DOWN = "org/new-model info: ConnectError: [Errno -2] Name or service not known after 5 attempts"


# --- the sync errors, as the real client writes them --------------------------------------------


def failed_sync(client: HubClient, repo_id: str = "org/model") -> str:
    """Sync `repo_id` through `client` and return the sync_error it stored."""
    model, _ = HubModel.objects.track(repo_id, via="track")
    with pytest.raises(HubUnavailable):
        RegistrySync(client).sync(model)
    return HubModel.objects.get(pk=model.pk).sync_error


@pytest.fixture
def client_for(hub_settings: Any, sleeps: Sleeps) -> Callable[..., HubClient]:
    def make(**options: Any) -> HubClient:
        return HubClient(sleep=sleeps, clock=sleeps.clock, **{"timeout": 2.0, **options})

    return make


def test_connection_refused_is_the_hub_not_reached(client_for: Callable[..., HubClient]) -> None:
    error = failed_sync(client_for(endpoint=f"http://127.0.0.1:{free_port()}", max_attempts=2))
    assert "ConnectError" in error and "after 2 attempts" in error
    explained = explain_sync_error(error)
    assert explained is not None and explained.problem == Problem.UNREACHABLE
    assert explained.sentence == (
        "The Hub could not be reached (connection refused); we retry automatically."
    )


def test_a_name_that_does_not_resolve_is_said_so() -> None:
    explained = explain_sync_error(DNS_DOWN)
    assert explained is not None and explained.problem == Problem.UNREACHABLE
    assert explained.sentence == (
        "The Hub could not be reached (name not resolved); we retry automatically."
    )
    timeout = explain_sync_error("org/m info: ConnectTimeout: timed out after 5 attempts")
    assert timeout is not None and "(connection timed out)" in timeout.sentence


def test_server_errors_after_the_retries(
    client_for: Callable[..., HubClient], fake_hub: FakeHub
) -> None:
    fake_hub.store.create_repo("org/down")
    fake_hub.inject("500", times=100)
    error = failed_sync(client_for(), "org/down")
    assert error == "org/down info: Hub error 500 after 5 attempts"
    explained = explain_sync_error(error)
    assert explained is not None and explained.problem == Problem.HUB_ERROR
    assert explained.sentence == (
        "The Hub answered with a server error (500); we retry automatically."
    )


def test_rate_limit_says_how_long_the_hub_asked_us_to_wait(
    client_for: Callable[..., HubClient], fake_hub: FakeHub
) -> None:
    fake_hub.store.create_repo("org/busy")
    fake_hub.inject("429", times=100, retry_after=600)
    error = failed_sync(client_for(), "org/busy")
    assert error == "org/busy info: rate limited for 601s"
    explained = explain_sync_error(error)
    assert explained is not None and explained.problem == Problem.RATE_LIMITED
    assert explained.wait_seconds == 601
    assert explained.sentence == (
        "The Hub is rate-limiting our requests and asked us to wait 10 minutes; "
        "we retry automatically."
    )
    # Short 429s retried until the attempts ran out, and our own bucket's pause.
    for text in (
        "org/m info: rate limited (429, retry after 12s) after 5 attempts",
        "org/m info: rate limit, retry in 45s",
    ):
        short = explain_sync_error(text)
        assert short is not None and short.problem == Problem.RATE_LIMITED, text
        assert "asked us to wait" in short.sentence and "seconds" in short.sentence


def test_slow_answers_are_a_timeout(
    client_for: Callable[..., HubClient], fake_hub: FakeHub
) -> None:
    fake_hub.store.create_repo("org/slow")
    fake_hub.inject("slow", times=100, delay=1.0)
    error = failed_sync(client_for(timeout=0.2, max_attempts=2), "org/slow")
    assert "ReadTimeout" in error
    explained = explain_sync_error(error)
    assert explained is not None and explained.problem == Problem.TIMEOUT
    assert explained.sentence == "The Hub did not answer in time; we retry automatically."


@pytest.mark.parametrize(
    ("error", "problem"),
    [
        ("org/m@abcdef12 tree : RemoteProtocolError: peer closed connection", Problem.DROPPED),
        ("org/m info: Hub answered 400", Problem.HUB_ERROR),
        ("org/m: the Hub lists no commits", Problem.BAD_ANSWER),
        ("org/m commits: the Hub did not answer a list", Problem.BAD_ANSWER),
        ("something nobody planned for", Problem.UNKNOWN),
    ],
)
def test_the_other_failures_have_words_too(error: str, problem: Problem) -> None:
    explained = explain_sync_error(error)
    assert explained is not None and explained.problem == problem
    assert explained.sentence.endswith("we retry automatically.")
    assert "Error" not in explained.sentence and "org/m" not in explained.sentence


def test_no_error_is_no_sentence() -> None:
    assert explain_sync_error("") is None
    assert explain_status(ModelStatus.OK, "") is None
    assert explain_status(ModelStatus.PENDING, "") is None


def test_a_missing_repo_as_the_sync_records_it(
    client_for: Callable[..., HubClient],
) -> None:
    model, _ = HubModel.objects.track("org/never-was", via="track")
    RegistrySync(client_for()).sync(model)
    model.refresh_from_db()
    assert (model.status, model.status_reason) == ("missing", "not found on the Hub (404)")
    explained = explain_status(model.status, model.status_reason)
    assert explained is not None and explained.problem == Problem.MISSING
    assert explained.sentence.startswith("The Hub has no repo by this name (404)")


@pytest.mark.parametrize(
    ("status", "reason", "problem", "words"),
    [
        # registry.hub.unavailable_status, and sync's fallback for a Hub that hides the code.
        (
            "gated",
            "gated: accept the conditions on the Hub with our token",
            Problem.GATED,
            "gated on the Hub",
        ),
        ("gated", "gated", Problem.GATED, "gated on the Hub"),
        ("private", "private: the Hub refused access (401)", Problem.PRIVATE, "access (401)"),
        ("disabled", "disabled on the Hub", Problem.DISABLED, "disabled this repo"),
        ("missing", "not found on the Hub (410)", Problem.MISSING, "by this name (410)"),
        ("no_template", "no chat template", Problem.NO_TEMPLATE, "no chat template"),
        # BrokenRepo messages from registry.sync and registry.hub.
        (
            "broken",
            "tokenizer_config.json is 9,000,000 bytes, over the 2,000,000-byte cap",
            Problem.BROKEN,
            "(tokenizer_config.json is 9,000,000 bytes, over the 2,000,000-byte cap)",
        ),
        ("broken", "", Problem.BROKEN, "(no reason recorded)"),
    ],
)
def test_each_status_has_a_sentence(status: str, reason: str, problem: Problem, words: str) -> None:
    explained = explain_status(status, reason)
    assert explained is not None and explained.problem == problem
    assert words in explained.sentence and not explained.retrying


def test_describe_reads_only_the_row(django_assert_num_queries: DjangoAssertNumQueries) -> None:
    never = HubModel.objects.create(repo_id="org/a", author="org", sync_error=DNS_DOWN)
    synced = HubModel.objects.create(
        repo_id="org/b",
        author="org",
        status=ModelStatus.OK,
        sync_error=DNS_DOWN,
        last_synced_at=timezone.now(),
    )
    with django_assert_num_queries(0):
        first, later = describe(never), describe(synced)
    assert (first.label, first.tone) == ("Sync failing", "error")
    assert first.sentence.startswith("Not synced yet. The Hub could not be reached")
    assert (later.label, later.tone) == ("Last sync failed", "warn")
    assert later.sentence.startswith("Showing what was last synced.")
    queued = describe(HubModel(repo_id="org/c"))
    assert queued.sentence == "Not synced yet: the first sync is queued."


# --- the model page -------------------------------------------------------------------------


@pytest.fixture
def no_banner_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The banner's answer only as the test sets it: no background refresh races the test."""
    deadline = time.monotonic() + 5
    while page_status._refreshing and time.monotonic() < deadline:
        time.sleep(0.01)  # one started by an earlier test: let it finish first
    monkeypatch.setattr(page_status, "HUB_BANNER_SECONDS", 3600.0)
    page_status.forget_hub_banner()
    page_status.refresh_hub_banner()
    yield
    page_status.forget_hub_banner()


@pytest.fixture
def unreachable_model() -> HubModel:
    """Tracked while the Hub could not be reached: never synced, the sync failed to connect."""
    model, _ = HubModel.objects.track("org/new-model", via="form")
    record_failure(model.pk, DNS_DOWN)
    return HubModel.objects.get(pk=model.pk)


@pytest.mark.usefixtures("healthy_service", "no_banner_thread")
def test_the_page_of_a_model_whose_sync_failed_says_why(
    client: Client, unreachable_model: HubModel
) -> None:
    body = client.get("/m/org/new-model/").content.decode()
    assert (
        "Not synced yet. The Hub could not be reached (name not resolved); "
        "we retry automatically." in body
    )
    assert "We have not found a chat template" not in body
    assert "ConnectError" not in body and "Errno" not in body  # no raw exception for visitors
    assert "<dt>Last synced</dt><dd>never" in body
    assert "Sync failing" in body and "nothing to check yet" in body
    assert "Retry now" not in body


@pytest.mark.usefixtures("healthy_service", "no_banner_thread")
def test_the_time_of_the_failure_is_kept_and_shown_until_a_success(client: Client) -> None:
    model = add_model("org/fine", TEMPLATE, commit="e" * 40, last_synced_at=timezone.now())
    record_failure(model.pk, "org/fine info: Hub error 503 after 5 attempts")
    failed_at = HubModel.objects.get(pk=model.pk).sync_failed_at
    assert failed_at is not None and (timezone.now() - failed_at).total_seconds() < 60
    HubModel.objects.filter(pk=model.pk).update(sync_failed_at=failed_at - timedelta(minutes=7))
    body = client.get("/m/org/fine/").content.decode()
    problem = body.split('<div class="status-problem">')[1].split("</div>")[0]
    assert "7\xa0minutes ago" in problem or "7 minutes ago" in problem
    api = client.get("/api/models/org/fine").json()
    assert api["sync_failed_at"] is not None
    # The next sync that reads the repo clears both (here it finds the repo gated).
    record_unavailable(model.pk, ModelStatus.GATED, "gated", None)
    model.refresh_from_db()
    assert (model.sync_error, model.sync_failed_at) == ("", None)


@pytest.mark.usefixtures("healthy_service", "no_banner_thread")
def test_a_synced_model_shows_when_it_was_synced_and_checked(client: Client) -> None:
    synced_at = timezone.now() - timedelta(hours=3)
    model = add_model("org/fine", TEMPLATE, commit="e" * 40, last_synced_at=synced_at)
    record_failure(model.pk, "org/fine info: Hub error 503 after 5 attempts")
    body = client.get("/m/org/fine/").content.decode()
    line = body.split('<dl class="status-line">')[1].split("</dl>")[0]
    exact = timezone.localtime(synced_at).strftime("%Y-%m-%d %H:%M:%S")
    assert f'title="{exact} UTC">3' in line and "hours ago</time>" in line
    assert "Last sync failed" in line
    assert "just now</time>" in line.split("Last checked")[1]  # checked when built
    # The verdict still shows; the failing sync is said beside it, in words.
    assert (
        "<dt>Last error</dt><dd>The Hub answered with a server error (503); "
        'we retry automatically. <span class="muted">(<time datetime=' in line
    )


@pytest.mark.usefixtures("healthy_service", "no_banner_thread")
def test_staff_get_a_retry_button_that_reuses_the_resync_action(
    client: Client, unreachable_model: HubModel
) -> None:
    client.force_login(User.objects.create_user("ops", "ops@example.org", "pw", is_staff=True))
    body = client.get("/m/org/new-model/").content.decode()
    retry = body.split('<div class="status-actions">')[1].split("</div>")[0]
    assert 'hx-post="/m/org/new-model/resync"' in retry and ">Retry now</button>" in retry
    assert "csrfmiddlewaretoken" in retry
    # Staff may see what the client said, escaped.
    assert "ConnectError: [Errno -2] Name or service not known" in retry


@pytest.mark.usefixtures("healthy_service", "no_banner_thread")
def test_the_page_costs_no_more_queries_for_the_status(
    client: Client,
    unreachable_model: HubModel,
    django_assert_num_queries: DjangoAssertNumQueries,
    settings: Any,
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    # The model, its latest probe, its timeline and its derivatives: the status line reads the
    # loaded row.
    with django_assert_num_queries(4):
        client.get("/m/org/new-model/")


# --- the banner -----------------------------------------------------------------------------


def test_hub_unreachable_is_one_query_and_two_while_a_sync_fails(
    unreachable_model: HubModel, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    with django_assert_num_queries(2):  # the failing models, then a recent success
        assert hub_unreachable()
    HubModel.objects.filter(pk=unreachable_model.pk).update(sync_error="")
    with django_assert_num_queries(1):
        assert not hub_unreachable()


def test_the_failing_models_are_found_through_their_own_index() -> None:
    """With none failing, the banner's question reads an empty index, not the table (at
    100,000 models a scan of every row took 110 to 135 ms, every 30 s in each web process)."""
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    HubModel.objects.bulk_create(
        HubModel(repo_id=f"org-{i % 50}/model-{i}", author=f"org-{i % 50}") for i in range(5000)
    )
    with CaptureQueriesContext(connection) as asked:
        assert not hub_unreachable()
    (failing,) = asked.captured_queries
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
        cursor.execute(f"EXPLAIN {failing['sql']}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "hubmodel_sync_failing" in plan and "Seq Scan" not in plan, plan


def test_a_recent_success_means_the_hub_answers(unreachable_model: HubModel) -> None:
    now = timezone.now()
    ok = HubModel.objects.create(repo_id="org/ok", author="org", last_synced_at=now)
    assert not hub_unreachable(now)
    # Long enough ago, that success no longer proves anything.
    assert hub_unreachable(now + timedelta(minutes=16))
    # Other failures are not "unreachable"; demo and imported models never count.
    HubModel.objects.filter(pk=ok.pk).delete()
    HubModel.objects.filter(pk=unreachable_model.pk).update(
        sync_error="org/new-model info: Hub error 502 after 5 attempts"
    )
    assert not hub_unreachable(now)
    HubModel.objects.create(repo_id="demo/x", author="demo", is_demo=True, sync_error=DNS_DOWN)
    HubModel.objects.create(
        repo_id="local/x", author="local", tracked_via="local", sync_error=DNS_DOWN
    )
    assert not hub_unreachable(now)


@pytest.mark.usefixtures("healthy_service", "no_banner_thread")
def test_the_banner_shows_on_every_page_while_the_hub_is_unreachable(
    client: Client, unreachable_model: HubModel, settings: Any
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0  # a kept page keeps its banner until its TTL
    assert BANNER not in client.get("/").content.decode()  # not asked since the failure
    page_status.refresh_hub_banner()
    for url in ("/", "/m/org/new-model/", "/probes/"):
        assert BANNER in client.get(url).content.decode(), url
    # The Hub answers again: the next sync succeeds, the next refresh drops the banner.
    HubModel.objects.filter(pk=unreachable_model.pk).update(
        sync_error="", status=ModelStatus.NO_TEMPLATE, last_synced_at=timezone.now()
    )
    page_status.refresh_hub_banner()
    assert BANNER not in client.get("/probes/").content.decode()


def test_pages_never_wait_for_the_banner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stale or missing, the answer is asked again off the request's thread."""
    asked: list[str] = []

    def unreachable() -> bool:
        asked.append("x")
        return True

    monkeypatch.setattr(page_status, "hub_unreachable", unreachable)
    page_status.forget_hub_banner()
    try:
        assert page_status.hub_banner() is False  # nothing known yet: no banner, no wait
        deadline = time.monotonic() + 5
        while page_status._refreshing and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asked == ["x"] and page_status.hub_banner() is True
    finally:
        page_status.forget_hub_banner()


def test_the_catalog_row_says_when_a_models_sync_is_failing(client: Any) -> None:
    from registry.models import HubModel

    HubModel.objects.create(
        repo_id="org/unreachable",
        author="org",
        sync_error="ConnectError: [Errno -2] Name or service not known (after 5 attempts)",
    )
    body = client.get("/?q=unreachable").content.decode()
    assert "Sync failing" in body and "the model page says why" in body
