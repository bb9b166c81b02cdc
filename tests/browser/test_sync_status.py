"""The sync status of a model tracked while the Hub was unreachable, in a real browser, on a
desktop and a phone, for a visitor and for staff."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from dashboard import status as page_status
from registry.models import HubModel
from registry.sync import record_failure
from tests.dashboard_data import add_model

from .conftest import ARTIFACTS, screenshot, screenshots_at_widths

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DNS_DOWN = "org/new-model info: ConnectError: [Errno -2] Name or service not known after 5 attempts"
SENTENCE = "The Hub could not be reached (name not resolved); we retry automatically."
BANNER = "The Hugging Face Hub cannot be reached from this server"
WIDTHS = {"desktop": 1280, "phone": 390}


@pytest.fixture
def hub_down(transactional_db: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One model never synced (DNS down), one synced earlier whose last sync failed; the banner's
    answer asked once, now, and kept for the test."""
    model, _ = HubModel.objects.track("org/new-model", via="form")
    record_failure(model.pk, DNS_DOWN)
    older = add_model(
        "org/known-model",
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        commit="f" * 40,
        last_synced_at=timezone.now() - timedelta(hours=2),
    )
    record_failure(older.pk, DNS_DOWN.replace("new-model", "known-model"))
    monkeypatch.setattr(page_status, "HUB_BANNER_SECONDS", 3600.0)
    assert page_status.refresh_hub_banner()
    yield
    page_status.forget_hub_banner()


@pytest.fixture
def as_staff(page: Any, live_server: Any) -> Iterator[None]:
    client = Client()
    client.force_login(User.objects.create_user("ops", "ops@example.org", "pw", is_staff=True))
    session = client.cookies["sessionid"].value
    page.context.add_cookies([{"name": "sessionid", "value": session, "url": live_server.url}])
    yield
    page.context.clear_cookies()


def no_sideways_scroll(page: Any) -> None:
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.usefixtures("hub_down")
def test_a_visitor_sees_why_the_model_is_not_synced(page: Any, live_server: Any) -> None:
    for name, width in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/m/org/new-model/")
        expect(page.locator(".banner-hub")).to_contain_text(BANNER)
        expect(page.locator(".sentence")).to_contain_text(SENTENCE)
        expect(page.locator(".status-line")).to_contain_text("never")
        expect(page.get_by_role("button", name="Retry now")).to_have_count(0)
        no_sideways_scroll(page)
        screenshot(page, f"sync-status-unreachable-{name}")
        page.goto(f"{live_server.url}/m/org/known-model/")
        synced = page.locator(".status-line time").first
        expect(synced).to_have_text("2\xa0hours ago")
        assert (synced.get_attribute("title") or "").endswith(" UTC")
        expect(page.locator(".status-problem")).to_contain_text(SENTENCE)
        no_sideways_scroll(page)
        screenshot(page, f"sync-status-last-failed-{name}")
        # The panel alone, at its real size: a phone's full page is too tall to read.
        page.locator(".verdict-panel").screenshot(path=str(ARTIFACTS / f"sync-panel-{name}.png"))
        page.goto(f"{live_server.url}/")
        expect(page.locator(".banner-hub")).to_be_visible()


@pytest.mark.usefixtures("hub_down", "as_staff")
def test_staff_can_retry_from_the_status_line(page: Any, live_server: Any) -> None:
    for name, width in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/m/org/new-model/")
        expect(page.get_by_role("button", name="Retry now")).to_be_visible()
        no_sideways_scroll(page)
        screenshot(page, f"sync-status-staff-{name}")
        page.locator(".verdict-panel").screenshot(
            path=str(ARTIFACTS / f"sync-panel-staff-{name}.png")
        )
    page.get_by_role("button", name="Retry now").click()
    expect(page.locator("#sync-status")).to_contain_text("Sync queued")
    expect(page.locator("#sync-status")).to_contain_text(SENTENCE)


@pytest.mark.usefixtures("as_staff")
def test_after_a_staff_recheck_the_checked_time_follows_without_a_reload(
    page: Any, live_server: Any
) -> None:
    from registry.models import CheckRun
    from registry.verdicts import check_in_process, record_check
    from tests.dashboard_data import TOKENS

    model = add_model("org/rechecked", "{% for m in messages %}{{ m.content }}{% endfor %}",
                      commit="9" * 40)  # fmt: skip
    version = model.current_snapshot.default_template  # type: ignore[union-attr]
    CheckRun.objects.filter(template_version=version).update(
        finished_at=timezone.now() - timedelta(days=3)
    )
    page.goto(f"{live_server.url}/m/org/rechecked/")
    engine = page.locator("#engine-line")
    before = engine.locator("time").get_attribute("datetime")
    page.get_by_role("button", name="Re-check template").click()
    expect(page.locator("#check-status")).to_contain_text("Checking…")
    expect(engine).to_contain_text("queued")
    run = record_check(version, check_in_process(version, TOKENS))
    assert run.finished_at is not None
    # The poll that brings the verdict brings the pins' time too.
    expect(engine.locator("time")).to_have_attribute("datetime", run.finished_at.isoformat())
    assert before != run.finished_at.isoformat()
    screenshots_at_widths(page, "recheck-done")
