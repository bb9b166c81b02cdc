"""What people do on the dashboard, in Chromium: search, filter, open, diff, copy, dark mode."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from registry.models import HubModel
from registry.verdicts import check_in_process, record_check
from tests.dashboard_data import PENDING_REPO, TOKENS, Catalog, build_catalog

from .conftest import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def catalog(transactional_db: None) -> Catalog:
    return build_catalog()


def repos(page: Any) -> list[str]:
    return list(page.locator("#results a.repo").all_inner_texts())


def test_search_as_you_type_updates_results_and_url_without_reloading(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(live_server.url + "/")
    page.evaluate("window.__sameDocument = true")
    table_top = page.locator("#results table").bounding_box()["y"]
    page.locator("#q").press_sequentially("mark", delay=40)
    expect(page.locator("#results a.repo")).to_have_count(1)
    assert repos(page) == ["cachesafe-demo/marker-chat-8b"]
    expect(page).to_have_url(re.compile(r"/\?q=mark$"))
    assert page.evaluate("window.__sameDocument") is True  # htmx swapped, no navigation
    # Nothing above the results moved while searching.
    assert page.locator("#results table").bounding_box()["y"] == table_top
    screenshot(page, "catalog-search")
    # The URL is the state: pasted into a new tab it shows the same results.
    other = page.context.new_page()
    other.goto(page.url)
    assert repos(other) == ["cachesafe-demo/marker-chat-8b"]
    expect(other.locator("#q")).to_have_value("mark")
    other.close()
    # Clearing the search brings everything back.
    page.locator("#q").fill("")
    expect(page.locator("#results a.repo")).to_have_count(5)


def test_filters_apply_on_change_and_survive_a_reload(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(live_server.url + "/")
    page.get_by_label("Verdict").select_option("unsafe")
    expect(page.locator("#results a.repo")).to_have_count(3)
    page.get_by_label("Architecture").select_option("yes")
    expect(page.locator("#results a.repo")).to_have_count(1)
    assert repos(page) == ["cachesafe-demo/thinker-30b-a3b"]
    expect(page).to_have_url(re.compile(r"verdict=unsafe&hybrid=yes"))
    page.reload()
    expect(page.get_by_label("Verdict")).to_have_value("unsafe")
    expect(page.get_by_label("Architecture")).to_have_value("yes")
    assert repos(page) == ["cachesafe-demo/thinker-30b-a3b"]
    page.get_by_role("link", name="Clear filters").click()
    expect(page.locator("#results a.repo")).to_have_count(5)


def test_a_link_with_the_typical_client_keeps_its_setup_through_a_filter_change(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    """`/?client=typical` judges the typical setup alone ("For your setup"), but the client
    menu, whose empty choice reads "Typical", showed no choice of it: the next filter change
    sent `client=`, and the rows went back to the headline's verdicts."""
    page.goto(live_server.url + "/?client=typical")
    expect(page.get_by_label("Your client")).to_have_value("")  # "Typical"
    page.get_by_label("Verdict").select_option("safe")
    expect(page).to_have_url(re.compile(r"verdict=safe"))
    expect(page).to_have_url(re.compile(r"thinking=default"))
    expect(page.get_by_label("Thinking")).to_have_value("default")
    setup_badges = page.locator('#results tbody [title="For your setup"]')
    expect(setup_badges.first).to_be_visible()
    expect(page.locator("#results tbody tr")).to_have_count(setup_badges.count())
    # Each row opens its model page judging the same setup, not the headline.
    page.locator("#results a.repo").first.click()
    expect(page.locator("#setup")).to_contain_text("Your setup:")


def test_back_shows_the_form_as_the_url_says(page: Any, live_server: Any, catalog: Catalog) -> None:
    """Search, filter, sort, then Back: the form and the results are those of the URL gone
    back to, and a change from there searches again."""
    page.goto(live_server.url + "/")
    page.locator("#q").press_sequentially("chat", delay=40)
    expect(page).to_have_url(re.compile(r"/\?q=chat$"))
    page.get_by_label("Verdict").select_option("unsafe")
    expect(page).to_have_url(re.compile(r"q=chat&verdict=unsafe$"))
    page.get_by_label("Sort by").select_option("name")
    expect(page).to_have_url(re.compile(r"sort=name"))
    shown = repos(page)
    page.go_back()
    expect(page).to_have_url(re.compile(r"/\?q=chat&verdict=unsafe$"))
    expect(page.locator("#q")).to_have_value("chat")
    expect(page.get_by_label("Verdict")).to_have_value("unsafe")
    expect(page.get_by_label("Sort by")).to_have_value("downloads")
    assert sorted(repos(page)) == sorted(shown)
    page.go_back()
    expect(page).to_have_url(re.compile(r"/\?q=chat$"))
    expect(page.get_by_label("Verdict")).to_have_value("")
    # Emptying the box from here searches again: everything comes back.
    page.locator("#q").fill("")
    expect(page.locator("#results a.repo")).to_have_count(5)


def test_open_a_model_then_a_diff_and_jump_to_the_divergence(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(live_server.url + "/")
    page.get_by_role("link", name="cachesafe-demo/marker-chat-8b").click()
    expect(page.locator("h1")).to_have_text("cachesafe-demo/marker-chat-8b")
    expect(page.locator(".sentence")).to_contain_text("earlier messages are re-rendered")
    # The first failing cell of the matrix opens that pair's diff.
    page.locator("table.matrix td.cell-fail a").first.click()
    expect(page.locator("h1")).to_contain_text("Request 1 → 2")
    expect(page).to_have_url(re.compile(r"/t/[0-9a-f]{64}/pair/default/chat/1/"))
    page.set_viewport_size({"width": 1280, "height": 500})
    page.get_by_role("link", name="Jump to the first difference").click()
    mark = page.locator("#divergence-after")
    expect(mark).to_be_in_viewport()
    expect(mark).to_be_focused()
    expect(page).to_have_url(re.compile(r"#divergence-after$"))
    assert "[LATEST]" in page.locator("#divergence-before").inner_text()


def test_copy_link_puts_the_pinned_url_on_the_clipboard(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(f"{live_server.url}/m/{catalog.unsafe.repo_id}/")
    page.get_by_role("button", name="Copy link").click()
    expect(page.locator(".share .copied")).to_have_text("Copied")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.endswith(f"/m/{catalog.unsafe.repo_id}/at/{catalog.unsafe.last_commit_sha}/")
    # The pinned link (absolute on SITE_URL) opens the same model at that commit.
    page.goto(live_server.url + urlsplit(copied).path)
    expect(page.locator(".pinned-note")).to_contain_text("as of commit")


def test_dark_mode_toggle_is_remembered(page: Any, live_server: Any, catalog: Catalog) -> None:
    page.emulate_media(color_scheme="light")
    page.goto(live_server.url + "/")
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    toggle = page.get_by_role("button", name="Dark mode")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    toggle.click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert dark != light and dark == "rgb(15, 20, 25)"
    page.goto(f"{live_server.url}/m/{catalog.changed.repo_id}/")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    # The system preference is followed until the reader chooses.
    page.evaluate("localStorage.clear()")
    page.emulate_media(color_scheme="dark")
    page.reload()
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(15, 20, 25)"


def test_keyboard_reaches_search_and_filters(page: Any, live_server: Any, catalog: Catalog) -> None:
    page.goto(live_server.url + "/")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    expect(page.locator("#q")).to_be_focused()
    page.keyboard.type("thinker")
    expect(page.locator("#results a.repo")).to_have_count(1)
    page.keyboard.press("Tab")
    expect(page.get_by_label("Verdict")).to_be_focused()


def test_checking_page_updates_itself_when_the_check_finishes(
    page: Any, live_server: Any, catalog: Catalog
) -> None:
    page.goto(f"{live_server.url}/m/{PENDING_REPO}/")
    expect(page.locator("#check-status")).to_contain_text("Checking…")
    screenshot(page, "model-checking")
    version = HubModel.objects.get(repo_id=PENDING_REPO).current_snapshot.default_template  # type: ignore[union-attr]
    record_check(version, check_in_process(version, TOKENS))
    expect(page.locator("#check-status")).to_contain_text("Show the full results", timeout=8000)
    expect(page.locator("#check-status")).not_to_have_attribute("hx-trigger", "every 2s")
    page.get_by_role("link", name="Show the full results").click()
    expect(page.locator("table.matrix")).to_be_visible()


def test_choose_your_setup_on_a_model_page(page: Any, live_server: Any, catalog: Catalog) -> None:
    page.goto(f"{live_server.url}/m/{catalog.safe.repo_id}/")
    setup = page.locator("#setup")
    expect(setup).to_contain_text("Verdict for the typical setup.")
    page.get_by_label("Engine", exact=True).select_option("hybrid")
    page.get_by_label("Client", exact=True).select_option("reasoning_content")
    page.get_by_role("button", name="Show the verdict").click()
    # The choice is in the URL, so the link a reader shares is their setup.
    expect(page).to_have_url(re.compile(r"client=reasoning_content&engine=hybrid"))
    expect(page.locator(".setup-sentence")).to_contain_text(
        "Cache-safe for a client that sends reasoning back as reasoning_content"
    )
    expect(page.get_by_label("Engine", exact=True)).to_have_value("hybrid")
    # Every setting is a chip; the chosen one is marked.
    expect(page.locator(".chips .chip-chosen")).to_have_count(1)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        screenshot(page, f"setup-{width}")
        # Nothing of the setup panel spills past the viewport on a phone.
        box = setup.bounding_box()
        assert box is not None and box["x"] + box["width"] <= width + 1


def test_diagnose_pasted_requests_for_each_cause(page: Any, live_server: Any) -> None:
    """A reader pastes their client's requests and a template; each cause is named on the page."""
    import json

    from tests.diagnose_cases import CASES

    page.goto(live_server.url + "/")
    page.get_by_role("link", name="Diagnose").click()
    expect(page.locator("h1")).to_have_text("Why is my cache missing?")
    for _name, template, bodies, pair, cause in CASES:
        page.locator("#d-requests").fill("\n".join(json.dumps(b) for b in bodies))
        page.locator("#d-template").fill(template)
        page.get_by_role("button", name="Diagnose").click()
        found = page.locator("ol.diagnosis > li").nth(pair - 1)
        expect(found).to_have_attribute("data-cause", cause)
        expect(found).to_contain_text(f"Request {pair} → {pair + 1}")
        # What was pasted stays in the form, so the next try starts from it.
        expect(page.locator("#d-template")).to_have_value(template)
    screenshot(page, "diagnose")
    page.locator("#d-requests").fill("{oops")
    page.get_by_role("button", name="Diagnose").click()
    expect(page.get_by_role("alert")).to_contain_text("line 1: not valid JSON")
