"""The Django templates' own syntax: what the template language would print as text."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def test_a_comment_opens_and_closes_on_one_line() -> None:
    """`{# … #}` is a comment on one line only: one that runs on to the next is printed as it
    is (the base template's ran across two lines and showed at the top of every page)."""
    found = [
        f"{path.relative_to(TEMPLATES)}:{number}"
        for path in sorted(TEMPLATES.rglob("*.html"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if line.count("{#") != line.count("#}")
    ]
    assert list(TEMPLATES.rglob("*.html")), TEMPLATES
    assert not found, f"comments across lines (use {{% comment %}}): {found}"


@pytest.mark.django_db
def test_no_template_syntax_reaches_a_page(client: Client, settings: SettingsWrapper) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    for path in ("/", "/?q=qwen", "/diagnose/", "/alerts/login/", "/track/", "/m/no/such/"):
        response = client.get(path)
        assert response.status_code in (200, 404), (path, response.status_code)
        body = response.content.decode()
        for syntax in ("{#", "#}", "{%", "%}"):
            assert syntax not in body, (path, syntax)
