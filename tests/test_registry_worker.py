"""The hub-queue tasks in a real Celery worker, against the fake Hub."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from registry.models import HubModel, ModelStatus, TemplateChange
from registry.tasks import sync_repo
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import fake_hub
from tests.workerproc import wait_for

pytestmark = pytest.mark.worker
__all__ = ["fake_hub"]


def test_tracking_through_the_api_gets_the_repo_synced_by_a_worker_once(
    celery_workers: Any, fake_hub: FakeHub, settings: Any
) -> None:
    settings.HF_ENDPOINT = fake_hub.url
    fake_hub.store.create_repo("acme/worked")
    fake_hub.store.add_commit(
        "acme/worked", {"tokenizer_config.json": tokenizer_config(b"{{ messages }}", None, None)}
    )
    celery_workers(
        queues="hub",
        extra_env={
            "HF_ENDPOINT": fake_hub.url,
            "HF_TOKEN": "",
            "HF_REQUESTS_PER_5MIN": "1000000000",
        },
    )
    response = Client().post(
        "/api/models", json.dumps({"repo_id": "acme/worked"}), content_type="application/json"
    )
    assert response.status_code == 201
    model = HubModel.objects.get(repo_id="acme/worked")
    wait_for(
        lambda: HubModel.objects.get(pk=model.pk).status == ModelStatus.OK, 60, "the queued sync"
    )
    # A duplicate delivery of the same task asks once (unchanged) and adds nothing.
    first_synced_at = HubModel.objects.get(pk=model.pk).last_synced_at
    fake_hub.reset_log()
    sync_repo.delay(model.pk)
    wait_for(
        lambda: HubModel.objects.get(pk=model.pk).last_synced_at != first_synced_at,
        60,
        "the second sync",
    )
    assert [r.path for r in fake_hub.requests()] == ["/api/models/acme/worked"]
    assert TemplateChange.objects.filter(model=model).count() == 1
