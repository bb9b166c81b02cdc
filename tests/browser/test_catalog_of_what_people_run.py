"""What people actually run, in Chromium: the catalog filtered to derivatives whose template
differs from their base's, a GGUF repo's files and the templates they embed, and the landing
page of a catalog that holds only demo models."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from registry.derivatives import refresh_drift
from registry.models import HubModel, TemplateVersion
from tests.browser.conftest import htmx_idle, screenshots_at_widths
from tests.test_derivatives import NEW, OLD
from tests.test_derivatives import family as family  # a fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_filter_the_catalog_to_stale_derivatives_and_read_a_gguf_repos_files(
    page: Any, live_server: Any, family: dict[str, HubModel]
) -> None:
    refresh_drift(family["base"])
    old = TemplateVersion.objects.get(text=OLD).sha256
    new = TemplateVersion.objects.get(text=NEW).sha256
    HubModel.objects.filter(pk=family["stale"].pk).update(
        format="gguf",
        gguf_files=[
            {"path": "stale-Q4_K_M.gguf", "id": "a", "size": 4_900_000_000, "status": "ok",
             "template": old, "reason": "", "bytes": 3_100_000},
            {"path": "stale-Q8_0.gguf", "id": "b", "size": 8_700_000_000, "status": "ok",
             "template": new, "reason": "", "bytes": 3_100_000},
            {"path": "stale-IQ2_XS.gguf", "id": "c", "size": 2_000_000_000, "status": "broken",
             "template": "", "bytes": 40,
             "reason": "truncated: the file ends at byte 40, inside metadata key 1 of 9"},
        ],
    )  # fmt: skip
    page.goto(live_server.url + "/")
    page.get_by_label("Against its base").select_option("differs")
    rows = page.locator("table.models tbody tr")
    expect(rows).to_have_count(2)
    expect(page).to_have_url(f"{live_server.url}/?drift=differs")
    htmx_idle(page)
    stale_row = rows.filter(has_text="mlx-community/stale")
    expect(stale_row.locator(".tag", has_text="GGUF")).to_be_visible()
    expect(stale_row.locator(".tag-warn")).to_have_text("older template than its base")
    screenshots_at_widths(page, "catalog-drift-differs")

    page.get_by_label("Format").select_option("gguf")
    expect(rows).to_have_count(1)
    htmx_idle(page)
    rows.first.get_by_role("link", name="mlx-community/stale").click()
    files = page.locator("section[aria-labelledby=gguf-h]")
    expect(files).to_contain_text("llama.cpp renders with the chat template embedded")
    expect(files.locator("tr.gguf-differs")).to_contain_text("stale-Q8_0.gguf")
    expect(files.locator("tr.gguf-broken")).to_contain_text("truncated: the file ends at byte 40")
    screenshots_at_widths(page, "gguf-files")
    files.locator("tr.gguf-differs").get_by_role("link", name="diff").click()
    expect(page.locator(".diff, table.code").first).to_be_visible()


def test_a_demo_catalog_says_so_and_how_to_fill_it_from_the_hub(
    page: Any, live_server: Any, transactional_db: None
) -> None:
    call_command("seed_demo", stdout=io.StringIO())
    page.goto(live_server.url + "/")
    notice = page.locator(".demo-notice")
    expect(notice).to_contain_text("These are demo models")
    expect(notice).to_contain_text("python manage.py discover")
    screenshots_at_widths(page, "demo-notice")
    # A filtered page is about the models, not the catalog: no notice there.
    page.goto(live_server.url + "/?verdict=safe")
    expect(page.locator(".demo-notice")).to_have_count(0)
