"""The reuse figures in Chromium: each one names what it is a mean of, and the reader can follow
one from the summary to the break list to a pair page and find the same number."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import ARTIFACTS, screenshots_at_widths
from tests.dashboard_data import Catalog

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_reader_follows_one_figure_from_summary_to_pair(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(f"{live_server.url}/m/{catalog.unsafe.repo_id}/")
    summary = page.locator(".sentence").first.inner_text()
    found = re.search(r"only about (\d+%) of the next prompt can come from the cache", summary)
    assert found, summary
    figure = found.group(1)
    assert "request pairs that break" in summary or "request pair that breaks" in summary

    definition = page.locator(".reuse-definition")
    expect(definition).to_contain_text("mean share of the next prompt a prefix cache keeps")
    expect(definition).to_contain_text(re.compile(r"over \d+ request pairs in \d+ conversations"))
    breaks = page.locator(".break-share")
    expect(breaks.first).to_contain_text(f"{figure} of the next prompt kept")
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        for part in ("matrix-h", "pairs-h"):
            panel = page.locator(f"section[aria-labelledby={part}]")
            panel.screenshot(path=str(ARTIFACTS / f"reuse-{part}-{width}.png"))
    page.set_viewport_size({"width": 1280, "height": 900})

    page.locator(".pair-links a").first.click()
    sentence = page.locator(".sentence").first
    expect(sentence).to_contain_text("A prefix cache can reuse")
    expect(sentence).to_contain_text(f"a prefix cache keeps {figure} on average")
    screenshots_at_widths(page, "reuse-pair")
