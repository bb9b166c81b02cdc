"""Batch syncs several repos at once: each thread its own client and database connection, one
shared rate-limit bucket, and no new sync once the Hub rate-limits us or time is up."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from registry.models import HubModel, ModelStatus
from registry.sync import sync_concurrently, sync_stalest
from tests.fakehub import FakeHub
from tests.fakehub.fixtures import fake_hub, hub_settings
from tests.test_registry_sync import CHATML, tc, upload

# Threads use their own connections: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["fake_hub", "hub_settings"]


def test_eight_repos_four_at_a_time_all_sync_once(
    fake_hub: FakeHub, hub_settings: Any, capsys: Any
) -> None:
    for number in range(8):
        upload(fake_hub, f"org/m{number}", {"tokenizer_config.json": tc(CHATML)})
    fake_hub.state.latency = 0.05  # so that the four really overlap
    fake_hub.reset_log()
    call_command("sync_hub", *[f"org/m{n}" for n in range(8)], "--concurrency", "4")
    assert set(HubModel.objects.values_list("status", flat=True)) == {ModelStatus.OK}
    # Every repo read once: model info and the template file at its head, then (the command
    # backfills) the commits and the initial commit's tree.
    per_repo: dict[str, int] = {}
    for entry in fake_hub.requests():
        per_repo[str(entry.repo_id)] = per_repo.get(str(entry.repo_id), 0) + 1
    assert per_repo == {f"org/m{n}": 4 for n in range(8)}
    assert "synced 8 repo(s)" in capsys.readouterr().out


def test_no_sync_starts_after_the_hub_rate_limits_us(fake_hub: FakeHub, hub_settings: Any) -> None:
    for number in range(6):
        upload(fake_hub, f"org/r{number}", {"tokenizer_config.json": tc(CHATML)})
        HubModel.objects.track(f"org/r{number}", via="track")
    # The first repo asked is told to come back in an hour (more than a sync waits).
    fake_hub.inject("429", times=50, match="/api/models/org/r0", retry_after=3600)
    # Every answer takes 0.2 s: r0's one refusal is back long before r1's four requests.
    fake_hub.state.latency = 0.2
    results = sync_stalest(10, concurrency=2)
    assert results[0].outcome == "failed" and "rate limited" in results[0].message
    # The other thread may have had one sync under way; nothing started after that.
    assert len(results) <= 2


def test_no_sync_starts_past_the_deadline(fake_hub: FakeHub, hub_settings: Any) -> None:
    upload(fake_hub, "org/late", {"tokenizer_config.json": tc(CHATML)})
    model, _ = HubModel.objects.track("org/late", via="track")
    assert sync_concurrently([model], concurrency=4, deadline=0.0, clock=lambda: 1.0) == []
    assert fake_hub.requests() == []
