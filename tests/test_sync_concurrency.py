"""Batch syncs several repos at once: each thread its own client and database connection, one
shared rate-limit bucket, and no new sync once the Hub rate-limits us or time is up."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from registry.models import HubModel, ModelStatus
from registry.sync import sync_batch, sync_concurrently, sync_stalest
from tests.fakehub import FakeHub
from tests.fakehub.fixtures import fake_hub, hub_settings
from tests.test_registry_sync import CHATML, tc, upload
from tests.test_sync_batches import one_repo_fails

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


def test_each_thread_keeps_one_connection_for_all_its_syncs_and_closes_it(
    fake_hub: FakeHub, hub_settings: Any
) -> None:
    from django.db.backends.signals import connection_created

    models = []
    for number in range(8):
        upload(fake_hub, f"org/c{number}", {"tokenizer_config.json": tc(CHATML)})
        models.append(HubModel.objects.track(f"org/c{number}", via="track")[0])
    opened: list[Any] = []

    def note(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(connection)

    # First syncs: the threads read the Hub, the calling thread records (open already).
    assert [r.outcome for r in sync_concurrently(models, concurrency=2)] == ["updated"] * 8
    synced = list(HubModel.objects.filter(pk__in=[m.pk for m in models]).order_by("pk"))
    connection_created.connect(note)
    try:
        # Unchanged: each thread writes the sync time itself.
        results = sync_concurrently(synced, concurrency=2)
    finally:
        connection_created.disconnect(note)
    assert [r.outcome for r in results] == ["unchanged"] * 8
    # One connection a thread (closed after each sync, it was one a sync), none left open.
    assert 1 <= len(opened) <= 2
    assert all(c.connection is None for c in opened)


def test_a_batch_says_which_models_to_sync_again(fake_hub: FakeHub, hub_settings: Any) -> None:
    hub_settings.HF_MAX_ATTEMPTS = 1
    pks = []
    for name in ("ok", "down", "later"):
        upload(fake_hub, f"org/{name}", {"tokenizer_config.json": tc(CHATML)})
        pks.append(HubModel.objects.track(f"org/{name}", via="track")[0].pk)
    gone, _ = HubModel.objects.track("org/untracked-since", via="track")
    gone.delete()
    fake_hub.inject("500", times=5, match="/api/models/org/down")
    results, again = sync_batch([pks[0], gone.pk, pks[1], pks[2]])
    assert [(r.repo_id, r.outcome) for r in results] == [
        ("org/ok", "updated"), ("org/down", "failed"), ("org/later", "updated"),
    ]  # fmt: skip
    assert again == [pks[1]]
    assert "500" in HubModel.objects.get(pk=pks[1]).sync_error

    # Rate-limited: that one and every model not started are tried again, after the wait.
    for name in ("r1", "r2"):
        upload(fake_hub, f"org/{name}", {"tokenizer_config.json": tc(CHATML)})
    limited = [HubModel.objects.track(f"org/{n}", via="track")[0].pk for n in ("r1", "r2")]
    fake_hub.inject("429", times=50, match="/api/models/org/r1", retry_after=3600)
    results, again = sync_batch(limited, concurrency=1)
    assert [r.outcome for r in results] == ["failed"]
    assert results[0].retry_after is not None and results[0].retry_after >= 3600
    assert again == limited
    assert not fake_hub.requests("org/r2")


def test_a_repo_that_fails_as_no_sync_expects_costs_the_threads_nothing(
    fake_hub: FakeHub, hub_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `test_sync_batches`'s one-at-a-time case, three threads at a time."""
    one_repo_fails(fake_hub, monkeypatch, concurrency=3)
