from __future__ import annotations

import pytest
from django.test import Client

from registry.demo import DEMO_MODELS, seed_demo_catalog
from registry.models import HubModel

pytestmark = pytest.mark.django_db


def test_demo_catalog_is_seeded_once() -> None:
    assert seed_demo_catalog() == len(DEMO_MODELS)
    assert seed_demo_catalog() == 0
    assert HubModel.objects.filter(is_demo=True).count() == len(DEMO_MODELS)


def test_catalog_lists_and_searches_models(client: Client) -> None:
    seed_demo_catalog()
    page = client.get("/").content.decode()
    for demo in DEMO_MODELS:
        assert demo.repo_id in page
    found = client.get("/", {"q": "marker"}).content.decode()
    assert "cachesafe-demo/marker-chat-8b" in found
    assert "cachesafe-demo/chatml-tools-7b" not in found


def test_htmx_search_returns_only_the_results_fragment(client: Client) -> None:
    seed_demo_catalog()
    response = client.get("/", {"q": "thinker"}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="results">')
    assert "<html" not in body
    assert "cachesafe-demo/thinker-30b-a3b" in body
