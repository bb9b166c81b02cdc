"""The model page links to the model on the configured Hub, and never for a demo model."""

from __future__ import annotations

import pytest
from django.test import Client
from django.test.utils import override_settings

from registry.demo import seed_demo_catalog
from tests.pipeline_data import SAFE_TEMPLATE, add_model

pytestmark = pytest.mark.django_db


@override_settings(HF_ENDPOINT="https://hub.example")
def test_the_hub_link_follows_hf_endpoint(client: Client) -> None:
    add_model("org/linked", SAFE_TEMPLATE)
    page = client.get("/m/org/linked/").content.decode()
    assert 'href="https://hub.example/org/linked"' in page


def test_demo_models_have_no_hub_link(client: Client) -> None:
    seed_demo_catalog()
    page = client.get("/m/cachesafe-demo/chatml-tools-7b/").content.decode()
    assert "cachesafe-demo/chatml-tools-7b" in page
    assert "on the Hub" not in page
