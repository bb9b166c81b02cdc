"""The surfaces of issue "the surfaces a user touches", in Chromium at a desktop's and a phone's
width: the catalog's reuse column and whole-sentence summaries, the API docs, the favicon and a
quiet console, and Back after a search showing a whole page (never the htmx fragment)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import screenshots_at_widths
from tests.dashboard_data import Catalog

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def reuse_cells(page: Any) -> list[int | None]:
    texts = page.locator("table.models tbody td.num:nth-child(3)").all_inner_texts()
    return [int(t.rstrip("%")) if t.strip().endswith("%") else None for t in texts]


def test_catalog_sorts_by_prompt_reuse_and_keeps_whole_sentences(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(live_server.url + "/")
    page.get_by_label("Sort by").select_option("reuse")
    expect(page).to_have_url(re.compile(r"sort=reuse"))
    shares = reuse_cells(page)
    known = [s for s in shares if s is not None]
    assert len(known) >= 3 and known == sorted(known, reverse=True), shares
    assert shares[len(known) :] == [None] * (len(shares) - len(known))  # unchecked sort last
    for summary in page.locator("table.models .summary").all_inner_texts():
        # Whole sentences, cut (if at all) after one: never mid-word, and the share kept.
        kept = summary.rstrip().removesuffix("…").rstrip()
        assert kept.endswith("."), summary
        if "Not cache-safe" in summary:
            assert re.search(r"only about \d+% of the next prompt", summary), summary
    expect(page.locator("abbr", has_text="Prompt reuse")).to_have_attribute(
        "title", re.compile("Mean share of the next prompt")
    )
    screenshots_at_widths(page, "catalog-by-reuse")


def test_unknown_filter_values_are_said_to_be_ignored(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(live_server.url + "/?verdict=bogus")
    expect(page.locator(".ignored")).to_contain_text("Ignored")
    expect(page.locator(".ignored")).to_contain_text("bogus")
    screenshots_at_widths(page, "catalog-ignored-filter")


def test_the_nav_api_link_opens_docs_for_people(page: Any, live_server: Any) -> None:
    page.goto(live_server.url + "/")
    page.get_by_role("link", name="API", exact=True).click()
    expect(page).to_have_url(re.compile(r"/api/docs$"))
    # Swagger UI, served from our static files, lists every operation with its summary.
    expect(page.get_by_text("Search and list tracked models")).to_be_visible(timeout=15_000)
    expect(page.get_by_text("Why did the cache miss?", exact=False)).to_be_visible()
    screenshots_at_widths(page, "api-docs")
    index = page.request.get(live_server.url + "/api/")
    assert index.ok and index.json()["docs"].endswith("/api/docs")


def test_a_page_asks_only_for_what_exists_and_logs_nothing(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    missing: list[str] = []
    errors: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{live_server.url}/m/{catalog.unsafe.repo_id}/")
    page.wait_for_load_state("networkidle")
    icon = page.locator("link[rel=icon]")
    expect(icon).to_have_attribute("href", re.compile(r"favicon\.svg"))
    assert page.request.get(live_server.url + icon.get_attribute("href")).ok
    assert missing == [] and errors == []


def test_back_after_a_search_shows_the_whole_page(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(live_server.url + "/")
    page.get_by_label("Search models").fill("marker")
    expect(page).to_have_url(re.compile(r"q=marker"))
    expect(page.locator("table.models tbody tr")).to_have_count(1)
    page.get_by_role("link", name=catalog.unsafe.repo_id).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(catalog.unsafe.repo_id)
    page.go_back()
    expect(page).to_have_url(re.compile(r"q=marker"))
    # The whole page, styled: the site's header and the search box, not a bare table.
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    expect(page.get_by_label("Search models")).to_have_value("marker")
    assert page.evaluate("getComputedStyle(document.body).fontFamily") != "Times New Roman"
    screenshots_at_widths(page, "back-after-search")
