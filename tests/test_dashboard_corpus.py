"""Every page of every real template in the reference corpus renders, escaped, with its diffs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from tests.dashboard_data import add_model

pytestmark = pytest.mark.django_db

# Markup that real templates write and that must only ever appear escaped on our pages.
HUB_MARKUP = re.compile(r"<(/?think|\|im_start\||\|start_header_id\||tool_call|/s|s)>")


def test_real_templates_render_on_every_page(
    client: Client, corpus_dir: Path, settings: SettingsWrapper
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    index = json.loads((corpus_dir / "index.json").read_text())
    problems: list[tuple[str, str]] = []
    diffs = 0
    for n, entry in enumerate(index):
        text = (corpus_dir / "templates" / entry["file"]).read_bytes().decode("utf-8")
        model = add_model(f"corpus/m{n}", text, commit=f"{n:040x}")
        sha = model.current_snapshot.default_template.sha256  # type: ignore[union-attr]
        urls = [f"/m/corpus/m{n}/", f"/t/{sha}/"]
        failures = client.get(f"/api/checks/{sha}").json()["failures"]
        urls += [f["diff_url"].removeprefix("http://testserver") for f in failures[:2]]
        for url in urls:
            response = client.get(url)
            body = response.content.decode()
            if response.status_code != 200:
                problems.append((entry["file"], f"{url}: {response.status_code}"))
            elif HUB_MARKUP.search(body):
                problems.append((entry["file"], f"{url}: unescaped {HUB_MARKUP.search(body)}"))
            elif "/pair/" in url:
                diffs += 1
                if 'id="divergence-after"' not in body:
                    problems.append((entry["file"], f"{url}: no divergence marked"))
    assert not problems, problems[:10]
    assert diffs > 50  # most real templates break somewhere: their diffs were really shown
