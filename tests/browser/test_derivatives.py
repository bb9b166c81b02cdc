"""A conversion's page and its base's, in Chromium: from a stale MLX conversion to its base, and
to the diff of what the base fixed since."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from registry.models import HubModel
from tests.browser.conftest import screenshots_at_widths
from tests.test_derivatives import BASE
from tests.test_derivatives import family as family  # a fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_from_a_stale_conversion_to_its_base_and_the_fix(
    page: Any, live_server: Any, family: dict[str, HubModel]
) -> None:
    page.goto(f"{live_server.url}/m/mlx-community/stale/")
    lineage = page.locator("section[aria-labelledby=lineage-h]")
    expect(lineage).to_contain_text(f"Derived from {BASE}")
    expect(lineage.locator(".drift-older")).to_contain_text("an older one of Qwen/Qwen3-8B's")
    screenshots_at_widths(page, "derivative-stale")
    lineage.get_by_role("link", name="What the base changed since").click()
    expect(page.locator(".diff, table.code").first).to_be_visible()
    page.goto(f"{live_server.url}/m/{BASE}/")
    derived = page.locator("section[aria-labelledby=lineage-h] li.item")
    expect(derived).to_have_count(3)
    expect(derived.filter(has_text="mlx-community/stale")).to_contain_text("Still carries")
    screenshots_at_widths(page, "base-with-derivatives")
    derived.filter(has_text="mlx-community/same").get_by_role("link").first.click()
    expect(page.locator(".drift-same")).to_contain_text("byte-identical")
