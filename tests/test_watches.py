"""Watches and discovery's queries: what they count as new, and when they run."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from registry import discovery
from registry.hub import HubClient
from registry.models import DiscoveryRun, HubModel, Watch, WatchKind
from registry.watching import refresh_watch, refresh_watches
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import fake_hub, hub_settings

pytestmark = pytest.mark.django_db
__all__ = ["fake_hub", "hub_settings"]

TEMPLATE = b"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def make_repo(hub: FakeHub, repo_id: str, **attrs: Any) -> None:
    hub.store.create_repo(repo_id, **attrs)
    hub.store.add_commit(
        repo_id, {"tokenizer_config.json": tokenizer_config(TEMPLATE, "<s>", "</s>")}, "Upload"
    )


def one_discovery_query(hub_settings: Any) -> None:
    """Discovery as one query: the top 10 conversational text-generation repos by downloads."""
    hub_settings.DISCOVERY_SORTS = ["downloads"]
    hub_settings.DISCOVERY_PIPELINE_TAGS = ["text-generation"]
    hub_settings.DISCOVERY_TAGS = "conversational"
    hub_settings.DISCOVERY_LIMIT = 10


def test_discovery_does_not_count_a_repo_tracked_in_other_letters_as_new(
    fake_hub: FakeHub, hub_settings: Any
) -> None:
    one_discovery_query(hub_settings)
    make_repo(fake_hub, "Acme/Chat-7B", pipeline_tag="text-generation", tags=["conversational"])
    # A reader tracked it first, typing other letters; its sync has run.
    model, _ = HubModel.objects.track("acme/chat-7b", via="form")
    HubModel.objects.filter(pk=model.pk).update(status="ok")

    run = discovery.discover(HubClient(timeout=5), trigger="command", queue_syncs=False)

    assert HubModel.objects.count() == 1
    assert run.new == 0, run.new_repo_ids  # it was tracked already
    assert discovery.progress(DiscoveryRun.objects.get(pk=run.pk)).done


def test_a_watch_does_not_report_a_repo_tracked_in_other_letters_as_new(
    fake_hub: FakeHub, hub_settings: Any
) -> None:
    make_repo(fake_hub, "Acme/Chat-7B")
    HubModel.objects.track("acme/chat-7b", via="form")
    watch = Watch.objects.create(kind=WatchKind.AUTHOR, author="acme")
    assert refresh_watch(watch, HubClient(timeout=5)) == []


def test_discovery_switched_off_tracks_nothing_through_the_hourly_watch_refresh(
    fake_hub: FakeHub, hub_settings: Any
) -> None:
    one_discovery_query(hub_settings)
    make_repo(fake_hub, "acme/old", pipeline_tag="text-generation", tags=["conversational"])
    discovery.discover(HubClient(timeout=5), trigger="command", queue_syncs=False)
    # The operator turns scheduled discovery off ("0 turns the schedule off").
    hub_settings.DISCOVERY_EVERY_HOURS = 0
    make_repo(fake_hub, "acme/new", pipeline_tag="text-generation", tags=["conversational"])

    refresh_watches(50, HubClient(timeout=5))
    assert not HubModel.objects.filter(repo_id="acme/new").exists()


def test_an_author_watch_tracks_the_new_repos_of_a_prolific_author(
    fake_hub: FakeHub, hub_settings: Any
) -> None:
    for number in range(101):
        make_repo(fake_hub, f"acme/model-{number}", downloads=1000 + number)
    call_command("watch", "--author", "acme", "--refresh", stdout=io.StringIO())
    # The author publishes a new repo (no downloads yet): the hourly refresh should track it.
    make_repo(fake_hub, "acme/brand-new", downloads=0)
    refresh_watch(Watch.objects.get(author="acme"), HubClient(timeout=5))
    assert HubModel.objects.filter(repo_id="acme/brand-new").exists()
