"""The Mac probe in Chromium: live progress on the model page, the queue page, staff actions."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import expect

from registry.models import ProbeRun
from registry.probes import store_report
from tests.dashboard_data import Catalog
from tests.test_probe_pages import REPORT, probed
from workers.models import WorkerHeartbeat

from .conftest import ARTIFACTS, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_queued_probe_shows_its_results_without_a_reload(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    run = ProbeRun.objects.create(model=catalog.unsafe, commit_sha="a" * 40)
    page.goto(f"{live_server.url}/m/{catalog.unsafe.repo_id}/#probe")
    page.evaluate("window.__sameDocument = true")
    status = page.locator("#probe-status")
    expect(status).to_contain_text("Waiting for the Mac worker")
    screenshot(page, "model-probe-queued")
    store_report(run.pk, REPORT)
    # The poll (every 3 s) swaps the results in: the verdict, the table, the machine.
    expect(status.locator("table.probe-results tbody tr")).to_have_count(2, timeout=10_000)
    expect(status).to_contain_text("Cache lost")
    expect(status).to_contain_text("Apple M2 Max")
    assert page.evaluate("window.__sameDocument") is True  # no navigation happened
    status.scroll_into_view_if_needed()
    screenshot(page, "model-probe-results")
    # Polling stopped: the last answer carries no trigger.
    assert status.get_attribute("hx-trigger") is None


def login_staff(page: Any, live_server: Any) -> None:
    client = Client()
    client.force_login(User.objects.create_user("ops", "ops@example.org", "pw", is_staff=True))
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    page.context.add_cookies(
        [{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}]
    )


def test_staff_queue_a_probe_and_the_queue_page_lists_it(
    page: Any, live_server: Any, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from probe.tasks import probe_model

    sent: list[Any] = []
    monkeypatch.setattr(probe_model, "apply_async", lambda *a, **k: sent.append((a, k)))
    probed(catalog.changed)
    WorkerHeartbeat.beat("mac-studio", ["mlx"], {})
    login_staff(page, live_server)
    try:
        page.goto(f"{live_server.url}/m/{catalog.unsafe.repo_id}/")
        expect(page.get_by_role("heading", name="Staff actions")).to_be_visible()
        page.get_by_role("button", name="Probe on the Mac").click()
        expect(page.locator("#probe-status")).to_contain_text("Waiting for the Mac worker")
        assert len(sent) == 1 and ProbeRun.objects.filter(model=catalog.unsafe).count() == 1
        screenshot(page, "model-staff-actions")
        page.get_by_role("link", name="See the probe queue").click()
        expect(page.locator("h1")).to_have_text("Probe queue")
        expect(page.locator("#probe-queue")).to_contain_text("1 probe waiting.")
        expect(page.locator("#probe-queue")).to_contain_text(catalog.unsafe.repo_id)
        expect(page.locator("#probe-queue")).to_contain_text(catalog.changed.repo_id)
        screenshot(page, "probe-queue")
        page.set_viewport_size({"width": 390, "height": 844})
        for path in ("/probes/", f"/m/{catalog.changed.repo_id}/"):
            page.goto(live_server.url + path)
            widths = page.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            assert widths[0] <= widths[1], (path, widths)
        screenshot(page, "model-probe-mobile")
        for theme in ("light", "dark"):  # the section alone, big enough to read
            page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.locator("#probe").screenshot(path=str(ARTIFACTS / f"probe-mobile-{theme}.png"))
    finally:
        page.context.clear_cookies()
