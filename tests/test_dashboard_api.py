"""The JSON API: model search and list, template versions, check results, the OpenAPI schema."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import resolve

from dashboard.openapi import PATHS
from registry.models import HubModel
from tests.dashboard_data import PENDING_REPO, Catalog, build_catalog

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


def sha(model: HubModel) -> str:
    assert model.current_snapshot is not None
    return model.current_snapshot.default_template.sha256


def get_json(client: Client, url: str, **params: Any) -> Any:
    response = client.get(url, params)
    assert response.status_code == 200, (url, response.status_code)
    assert response["Content-Type"] == "application/json"
    return response.json()


def test_list_searches_and_filters_like_the_catalog(client: Client, catalog: Catalog) -> None:
    everything = get_json(client, "/api/models")
    assert everything["count"] == 5 and everything["page"] == 1 and everything["next"] is None
    first = everything["results"][0]
    assert first["repo_id"] == "cachesafe-demo/chatml-tools-7b"
    assert first["verdict"] == "safe" and first["tools"] == "safe"
    assert first["url"] == "http://testserver/m/cachesafe-demo/chatml-tools-7b/"
    unsafe = get_json(client, "/api/models", q="demo", verdict="unsafe")
    assert {m["repo_id"] for m in unsafe["results"]} == {
        "cachesafe-demo/marker-chat-8b",
        "cachesafe-demo/thinker-30b-a3b",
    }
    thinker = next(m for m in unsafe["results"] if m["repo_id"].endswith("thinker-30b-a3b"))
    assert thinker["thinking"] == "same" and thinker["is_hybrid"] is True
    pending = get_json(client, "/api/models", verdict="pending")["results"]
    assert [m["repo_id"] for m in pending] == [PENDING_REPO]
    assert pending[0]["thinking"] is None  # not checked: nothing known per variant


def test_list_pages_link_to_each_other(client: Client, catalog: Catalog) -> None:
    HubModel.objects.bulk_create(
        HubModel(repo_id=f"bulk/m{i:03d}", author="bulk") for i in range(60)
    )
    first = get_json(client, "/api/models", author="bulk", sort="name")
    assert first["count"] == 60 and first["pages"] == 2 and len(first["results"]) == 50
    assert first["next"] == "http://testserver/api/models?author=bulk&sort=name&page=2"
    second = client.get(first["next"]).json()
    assert len(second["results"]) == 10 and second["previous"] is not None


def test_list_refuses_other_methods(client: Client) -> None:
    assert client.put("/api/models").status_code == 405


def test_template_detail(client: Client, catalog: Catalog) -> None:
    data = get_json(client, f"/api/templates/{sha(catalog.unsafe)}")
    assert data["sha256"] == sha(catalog.unsafe)
    assert "last_query_index" in data["text"]
    assert [m["repo_id"] for m in data["models"]] == [catalog.unsafe.repo_id]
    assert data["check"]["verdict"] == "unsafe"
    assert client.get(f"/api/templates/{'0' * 64}").status_code == 404


def test_check_detail_lists_failures_with_their_diff_pages(
    client: Client, catalog: Catalog
) -> None:
    data = get_json(client, f"/api/checks/{sha(catalog.changed)}")
    assert data["status"] == "done" and data["verdict"] == "unsafe"
    assert {v["key"] for v in data["variants"]} == {
        "default",
        "enable_thinking=false",
        "enable_thinking=true",
    }
    failure = data["failures"][0]
    assert failure["cause"] == "generation_prompt"
    assert failure["template_lines"] and failure["byte_offset"] > 0
    diff = client.get(failure["diff_url"].removeprefix("http://testserver"))
    assert diff.status_code == 200
    # A check that has not finished says so; a template never checked is a 404.
    running = get_json(client, f"/api/checks/{sha(HubModel.objects.get(repo_id=PENDING_REPO))}")
    assert running["status"] == "running" and running["progress"] == 40
    assert running["failures"] == []
    assert client.get(f"/api/checks/{'0' * 64}").status_code == 404


def test_model_detail_carries_the_check_and_probe(client: Client, catalog: Catalog) -> None:
    data = get_json(client, f"/api/models/{catalog.unsafe.repo_id}")
    assert data["verdict"] == "unsafe"
    assert data["check"]["failures"] and data["probe"] is None
    assert [v["key"] for v in data["variants"]] == ["default"]


def openapi_examples(catalog: Catalog) -> dict[str, str]:
    return {
        "org": catalog.unsafe.repo_id.split("/")[0],
        "name": catalog.unsafe.repo_id.split("/")[1],
        "sha256": sha(catalog.unsafe),
    }


def test_openapi_documents_paths_that_answer(client: Client, catalog: Catalog) -> None:
    schema = get_json(client, "/api/openapi.json")
    assert schema["openapi"].startswith("3.1")
    assert set(schema["paths"]) == set(PATHS)
    values = openapi_examples(catalog)
    for template in schema["paths"]:
        url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], template)
        resolve(url)
        response = client.get(url)
        assert response.status_code == 200, (template, response.status_code)
        assert response["Content-Type"] == "application/json"
    # Every $ref points at a component that exists.
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', str(schema).replace("'", '"')))
    assert refs <= set(schema["components"]["schemas"])
