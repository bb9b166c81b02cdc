"""Pages people click, in a real browser: search, filters, a model, a diff, links, dark mode."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.conftest import CORPUS_DIR, corpus_available
from tests.dashboard_data import HOSTILE_REPO, PENDING_REPO, Catalog, add_model

from .conftest import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_screenshots_of_every_page(page: Any, live_server: Any, catalog: Catalog) -> None:
    base = live_server.url
    changed = catalog.changed.current_snapshot.default_template.sha256  # type: ignore[union-attr]
    pages = {
        "catalog": "/",
        "model-unsafe": f"/m/{catalog.unsafe.repo_id}/",
        "model-thinking": f"/m/{catalog.changed.repo_id}/",
        "model-safe": f"/m/{catalog.safe.repo_id}/",
        "model-pending": f"/m/{PENDING_REPO}/",
        "model-hostile": f"/m/{HOSTILE_REPO}/",
        "model-unknown": "/m/nobody/nothing/",
        "template": f"/t/{changed}/",
        "version-diff": f"/t/{changed}/vs/{catalog.old_version.sha256}/",
        "pair": f"/t/{changed}/pair/enable_thinking=true/reasoning_history/1/",
        "track": "/track/",
    }
    for name, path in pages.items():
        page.goto(base + path)
        assert page.locator("h1").first.is_visible()
        screenshot(page, name)
    # A real template (from the reference corpus): long source, thinking variants, tools.
    if not corpus_available():
        return  # the pages above are checked; the real-template part needs the corpus
    text = (CORPUS_DIR / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    qwen = add_model("Qwen/Qwen3-0.6B", text, commit="e" * 40, is_hybrid=False)
    page.goto(f"{base}/m/{qwen.repo_id}/")
    screenshot(page, "model-qwen3")
    page.locator("table.matrix td.cell-fail a").first.click()
    expect(page.locator("h1")).to_contain_text("Request")
    screenshot(page, "pair-qwen3")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(base + "/")
    screenshot(page, "catalog-mobile")
    page.goto(base + f"/m/{catalog.unsafe.repo_id}/")
    screenshot(page, "model-mobile")


@pytest.mark.parametrize("width", [1280, 390])
def test_no_page_scrolls_sideways(
    page: Any, live_server: Any, catalog: Catalog, width: int
) -> None:
    """Wide things (matrix, renders, sources) scroll inside their own box, not the page."""
    changed = catalog.changed.current_snapshot.default_template.sha256  # type: ignore[union-attr]
    page.set_viewport_size({"width": width, "height": 844})
    for path in (
        "/?verdict=bogus&sort=reuse",
        "/",
        f"/m/{catalog.unsafe.repo_id}/",
        f"/m/{HOSTILE_REPO}/",
        f"/t/{changed}/",
        f"/t/{changed}/pair/enable_thinking=true/reasoning_history/1/",
        f"/t/{changed}/vs/{catalog.old_version.sha256}/",
        "/m/nobody/nothing/",
        "/?q=" + "a" * 300,  # echoed twice (the count, no match): one unbroken word
        f"/m/{catalog.unsafe.repo_id}/?client=" + "b" * 300,  # echoed in "Ignored: …"
    ):
        page.goto(live_server.url + path)
        widths = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], (path, widths)
    # A refused id is echoed in the error: one unbroken word, 120 characters long.
    page.goto(live_server.url + "/track/")
    page.fill("input[name=repo_id]", "acme/" + "m" * 250)
    page.get_by_role("button", name="Track").click()
    expect(page.locator(".errorlist")).to_contain_text("250 characters in one part, at most 96")
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], ("/track/ refusing a long id", widths)
