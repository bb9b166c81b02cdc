"""Discovery against a fake Hub of a few hundred repos: bases, their MLX, GGUF and fine-tuned
derivatives, through the real huggingface_hub client."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from registry import discovery
from registry.hub import HubClient
from registry.models import DiscoveryRun, HubModel, ModelStatus, Watch
from registry.signals import discovery_requested
from registry.sync import backfill_histories
from tests.fakehub import FakeHub
from tests.fakehub.derived import build_discovery_hub
from tests.fakehub.fixtures import Sleeps, fake_hub, hub_settings, sleeps

# Syncs run in threads, each with its own connection: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["fake_hub", "hub_settings", "sleeps"]


@pytest.fixture
def hub(fake_hub: FakeHub, corpus_dir: Path, hub_settings: Any) -> FakeHub:
    build_discovery_hub(fake_hub.store, corpus_dir)
    hub_settings.DISCOVERY_LIMIT = 1000
    hub_settings.DISCOVERY_SORTS = ["downloads", "trendingScore"]
    hub_settings.DISCOVERY_PIPELINE_TAGS = ["text-generation", "image-text-to-text"]
    hub_settings.DISCOVERY_TAGS = "conversational"
    return fake_hub


@pytest.fixture
def client_factory(hub_settings: Any, sleeps: Sleeps) -> Any:
    return lambda: HubClient(sleep=sleeps, clock=sleeps.clock, timeout=10)


def test_a_discovery_run_tracks_every_chat_model_and_syncs_them_concurrently(
    hub: FakeHub, client_factory: Any
) -> None:
    expected = {r.repo_id for r in hub.store.all() if "conversational" in r.tags and not r.private}
    assert len(expected) > 300
    run = discovery.discover(client_factory(), trigger="command", queue_syncs=False)

    assert run.error == ""
    assert run.listed == len(expected) and run.new == len(expected)
    assert set(HubModel.objects.values_list("repo_id", flat=True)) == expected
    assert set(HubModel.objects.values_list("tracked_via", flat=True)) == {"discovery"}
    assert Watch.objects.filter(discovery=True).count() == 4
    assert discovery.progress(run).read == 0

    hub.reset_log()
    results = discovery.sync_new(run, concurrency=4)
    assert len(results) == len(expected)
    assert [r for r in results if r.outcome == "failed"] == []
    state = discovery.progress(DiscoveryRun.objects.get(pk=run.pk))
    assert state.done and state.read == len(expected)
    # First syncs read heads only: a base's older templates are not known yet, so a copy of
    # one reads as edited until the backfill has read the base's history.
    before = dict(HubModel.objects.values_list("repo_id", "drift"))
    assert "older" not in before.values()
    sync_requests = len(hub.requests())
    backfilled = backfill_histories(1000)
    assert len(backfilled) == len(expected) - len(
        [r for r in expected if HubModel.objects.get(repo_id=r).format == "gguf"]
    )

    models = {m.repo_id: m for m in HubModel.objects.all()}
    # Formats from the files; GGUF repos judged by their embedded template.
    assert {m.format for m in models.values()} == {"safetensors", "mlx", "gguf"}
    gguf = [m for m in models.values() if m.format == "gguf"]
    assert len(gguf) > 90
    assert all(m.current_snapshot is not None for m in gguf if m.status == ModelStatus.OK)
    assert {m.current_snapshot.source_file for m in gguf if m.current_snapshot} == {"gguf"}
    # Uploads cut short are listed broken, and the repo still has its verdict's template.
    cut = [m for m in gguf if any(e["status"] == "broken" for e in m.gguf_files)]
    assert cut and all(m.status == ModelStatus.OK for m in cut)
    # Derivatives know how their template relates to the base's, stored for the filters.
    drift = {m.repo_id: m.drift for m in models.values()}
    assert {drift[r] for r in drift if r.startswith("finetuner/")} == {"edited"}
    assert {drift[r] for r in drift if r.endswith("-sft-4bit")} == {"same"}  # of the fine-tune
    mlx_kinds = {drift[r] for r in drift if r.startswith("mlx-community/") and "-sft-" not in r}
    assert mlx_kinds == {"same", "older"}  # older where the base changed its template later
    assert drift["orphan/lost-base-4bit"] == "" and drift["self/loop"] == ""

    # Requests per new repo's first sync, counted at the fake Hub: model info and the template
    # files at the head (at most 3), or for GGUF one info, one `expand=gguf` and one range
    # request per file.
    per_repo: dict[str, int] = {}
    for entry in hub.requests()[:sync_requests]:
        if entry.repo_id:
            per_repo[entry.repo_id] = per_repo.get(entry.repo_id, 0) + 1
    for model in gguf:
        assert per_repo[model.repo_id] == 2 + len(model.gguf_files)
    assert max(per_repo[m.repo_id] for m in models.values() if m.format != "gguf") <= 3

    # A second run finds nothing new.
    again = discovery.discover(client_factory(), trigger="command", queue_syncs=False)
    assert again.listed == len(expected) and again.new == 0


def test_the_queries_follow_the_settings(hub: FakeHub, client_factory: Any, settings: Any) -> None:
    settings.DISCOVERY_LIMIT = 10
    settings.DISCOVERY_SORTS = ["trendingScore"]
    settings.DISCOVERY_PIPELINE_TAGS = ["text-generation"]
    run = discovery.discover(client_factory(), trigger="command", queue_syncs=False)
    trending = sorted(
        (
            r
            for r in hub.store.all()
            if r.pipeline_tag == "text-generation" and "conversational" in r.tags
        ),
        key=lambda r: (r.trending_score, r.repo_id),
        reverse=True,
    )
    assert run.new_repo_ids == [r.repo_id for r in trending[:10]]
    # The earlier settings' watches are gone; hand-made watches are not touched.
    assert [str(w) for w in Watch.objects.filter(discovery=True)] == [
        "top 10 by trendingScore text-generation tagged conversational"
    ]


def test_an_unreachable_hub_is_recorded_and_the_demo_page_says_how_to_connect(
    db: None, settings: Any, client: Client
) -> None:
    settings.HF_ENDPOINT = "http://127.0.0.1:9"  # nothing listens there
    settings.HF_MAX_ATTEMPTS = 1
    call_command("seed_demo", stdout=io.StringIO())
    with pytest.raises(Exception, match="The Hub could not be read"):
        call_command("discover", stdout=io.StringIO())
    run = DiscoveryRun.objects.get()
    assert run.finished_at is not None and "The Hub could not be read" in run.error
    page = client.get("/").content.decode()
    assert "These are demo models" in page
    assert "python manage.py discover" in page
    assert "http://127.0.0.1:9" in page
    assert "Discovery stopped" in page


def test_the_command_syncs_the_new_repos_itself_with_sync(
    hub: FakeHub, settings: Any, client: Client
) -> None:
    out = io.StringIO()
    call_command("discover", "--sync", "--concurrency", "3", "--limit", "15", stdout=out)
    text = out.getvalue()
    new = DiscoveryRun.objects.get().new
    assert 15 <= new <= 4 * 15  # four queries of at most 15, some overlapping
    assert settings.DISCOVERY_LIMIT == 1000  # the option is for this run only
    assert f"{new} new, now tracked" in text
    assert f"{new} of {new} new repos read" in text
    assert not HubModel.objects.filter(status=ModelStatus.PENDING).exists()
    # The catalog says when discovery last ran, and no longer calls the catalog a demo.
    page = client.get("/").content.decode()
    assert "These are demo models" not in page
    assert f"{new} new." in page


def test_staff_start_a_discovery_from_the_catalog_once_at_a_time(db: None, client: Client) -> None:
    asked: list[int] = []

    def heard(sender: Any, run_id: int, **kwargs: Any) -> None:
        asked.append(run_id)

    discovery_requested.connect(heard, dispatch_uid="test-discovery")
    try:
        assert client.post("/discovery/run").status_code == 403
        client.force_login(User.objects.create_user("ops", "o@example.org", "pw", is_staff=True))
        assert 'action="/discovery/run"' in client.get("/").content.decode()
        answer = client.post("/discovery/run", headers={"HX-Request": "true"})
        assert answer.status_code == 200
        run = DiscoveryRun.objects.get()
        assert asked == [run.pk] and run.trigger == "button"
        assert 'hx-get="/discovery/"' in answer.content.decode()  # polls while it runs
        again = client.post("/discovery/run", headers={"HX-Request": "true"})
        assert "A discovery is already running." in again.content.decode()
        assert DiscoveryRun.objects.count() == 1
    finally:
        discovery_requested.disconnect(dispatch_uid="test-discovery")


def test_a_scheduled_discovery_runs_only_when_due(db: None, settings: Any) -> None:
    settings.DISCOVERY_EVERY_HOURS = 0
    assert not discovery.due()
    settings.DISCOVERY_EVERY_HOURS = 24
    assert discovery.due()
    DiscoveryRun.objects.create(trigger="schedule")
    assert not discovery.due()
