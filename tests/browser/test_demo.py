"""A fresh install's demo in Chromium: it reads like synced data (commit ids, dates, history), a
template change leads to its diff and the feed, and every demo page says it is a demo."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from registry.demo import seed_demo_catalog
from registry.models import HubModel
from tests.browser.conftest import screenshots_at_widths

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_demo_has_history_a_diff_and_a_feed(page: Any, live_server: Any) -> None:
    seed_demo_catalog()
    thinker = HubModel.objects.get(repo_id="cachesafe-demo/thinker-30b-a3b")
    page.goto(live_server.url + "/")
    expect(
        page.locator("tr", has_text=thinker.repo_id).locator(".tag", has_text="demo")
    ).to_be_visible()
    page.get_by_role("link", name=thinker.repo_id).click()
    expect(page.get_by_text("(demo model)")).to_be_visible()
    history = page.locator("section[aria-labelledby=history-h]")
    expect(history.locator("li")).to_have_count(2)
    expect(history).to_contain_text("Strip reasoning from earlier turns")
    expect(history).not_to_contain_text("000000000000")
    pinned = f"/m/{thinker.repo_id}/at/{thinker.last_commit_sha}/"
    assert page.locator("#permalink").input_value().endswith(pinned)
    screenshots_at_widths(page, "demo-model")
    history.get_by_role("link", name="What changed").click()
    expect(page.locator("h1")).to_contain_text("Template ")
    expect(page.locator("h1")).to_contain_text("→")
    expect(page.get_by_text("Breaks the cache").first).to_be_visible()
    screenshots_at_widths(page, "demo-version-diff")

    # The short commit id the page prints is a link that works.
    page.goto(f"{live_server.url}/m/{thinker.repo_id}/at/{thinker.last_commit_sha[:12]}/")
    expect(page.get_by_text("You are looking at this model as of commit")).to_be_visible()
    feed = page.request.get(live_server.url + "/feeds/changes.atom")
    assert feed.ok and feed.text().count("<entry>") == 4
