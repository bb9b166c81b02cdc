"""Real-browser tests: Playwright drives Debian's Chromium against pytest-django's live server.

Screenshots of every page, light and dark, land in test-artifacts/screenshots/ for a human to see.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_data import (
    Catalog,
    build_catalog,
    healthy_service,  # noqa: F401 - a fixture
)

# Playwright's sync API runs an event loop in this thread; Django's ORM calls here are plain sync.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM = os.environ.get("PLAYWRIGHT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Chromium is missing at {CHROMIUM}: apt-get install chromium (see .ci/run)")
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="cachesafe-chromium-") as profile,
        sync_playwright() as p,
    ):
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()


@pytest.fixture
def page(chromium: Any, live_server: Any, healthy_service: None) -> Iterator[Any]:  # noqa: F811
    chromium.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page = chromium.new_page()
    page.set_default_timeout(10_000)
    yield page
    page.evaluate("localStorage.clear()") if not page.is_closed() and page.url.startswith(
        "http"
    ) else None
    page.close()


@pytest.fixture
def catalog(transactional_db: None) -> Catalog:
    """The dashboard tests' small catalog, committed so the live server sees it."""
    return build_catalog()


def screenshot(page: Any, name: str) -> Path:
    """Full-page screenshot in the current theme, then in the other one."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    paths = []
    for theme in ("light", "dark"):
        page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
        path = ARTIFACTS / f"{name}-{theme}.png"
        page.screenshot(path=str(path), full_page=True)
        paths.append(path)
    page.evaluate("document.documentElement.dataset.theme = 'auto'")
    return paths[0]


def screenshots_at_widths(page: Any, name: str, widths: tuple[int, ...] = (1280, 390)) -> None:
    """Screenshots at a desktop's and a phone's width; the page never scrolls sideways."""
    for width in widths:
        page.set_viewport_size({"width": width, "height": 900})
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{name} scrolls sideways by {overflow}px at {width}px"
        screenshot(page, f"{name}-{width}")
    page.set_viewport_size({"width": 1280, "height": 900})


def htmx_idle(page: Any) -> None:
    """Wait until htmx has swapped, settled and bound what it swapped in (about 20 ms after the
    new markup shows): a control changed before that has no htmx handler yet."""
    page.wait_for_function(
        "() => !document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling')"
    )
