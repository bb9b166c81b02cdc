from __future__ import annotations

from typing import Any

import pytest

from registry.hub import HubClient
from registry.models import HubModel, ModelStatus, TemplateChange
from registry.sync import RegistrySync
from tests.fakehub import FakeHub
from tests.fakehub.fixtures import Sleeps, corpus_hub, fake_hub, hub_settings, sleeps

pytestmark = pytest.mark.django_db
__all__ = ["corpus_hub", "fake_hub", "hub_settings", "sleeps"]


@pytest.fixture
def syncer(hub_settings: Any, sleeps: Sleeps) -> RegistrySync:
    return RegistrySync(HubClient(sleep=sleeps, timeout=5))


def test_smoke(corpus_hub: FakeHub, syncer: RegistrySync) -> None:
    model, _ = HubModel.objects.track("Qwen/Qwen3-0.6B", via="track")
    result = syncer.sync(model)
    print(result, corpus_hub.requests("Qwen/Qwen3-0.6B"))
    model.refresh_from_db()
    assert model.status == ModelStatus.OK
    print(model.current_snapshot.source_file, model.model_type, model.template_files)
    print(list(TemplateChange.objects.values()))
    corpus_hub.reset_log()
    result = syncer.sync(model)
    print(result, corpus_hub.requests())
    assert len(corpus_hub.requests()) == 1
