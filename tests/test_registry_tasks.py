"""The hub-queue tasks, run in-process: one step at a time, bounded, single-running."""

from __future__ import annotations

from typing import Any

import pytest

from registry.hub import HubUnavailable
from registry.jobs import single_running
from registry.models import HubModel, ModelStatus, Watch, WatchKind
from registry.receivers import SYNC_BATCH
from registry.tasks import refresh_watches, sync_repo, sync_repos, sync_stalest_repos
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import fake_hub, hub_settings

pytestmark = pytest.mark.django_db
__all__ = ["fake_hub", "hub_settings"]


@pytest.fixture
def three_repos(fake_hub: FakeHub, hub_settings: Any) -> list[str]:
    repo_ids = ["acme/a", "acme/b", "acme/c"]
    for repo_id in repo_ids:
        fake_hub.store.create_repo(repo_id)
        fake_hub.store.add_commit(
            repo_id, {"tokenizer_config.json": tokenizer_config(repo_id.encode(), None, None)}
        )
        HubModel.objects.track(repo_id, via="track")
    return repo_ids


# The beat task syncs several repos at once, in threads with their own connections.
@pytest.mark.django_db(transaction=True)
def test_beat_sync_is_bounded_and_takes_the_stalest_first(
    three_repos: list[str], fake_hub: FakeHub
) -> None:
    assert sync_stalest_repos(limit=2) == 2
    synced = set(HubModel.objects.filter(status=ModelStatus.OK).values_list("repo_id", flat=True))
    assert synced == {"acme/a", "acme/b"}
    # Synced at once, a and b finish in either order: whichever finished first is older.
    older, newer = HubModel.objects.filter(status=ModelStatus.OK).order_by("last_synced_at")
    fake_hub.reset_log()
    assert sync_stalest_repos(limit=2) == 2
    # The never-synced one first, then the one synced longest ago (unchanged: one request).
    assert HubModel.objects.get(repo_id="acme/c").status == ModelStatus.OK
    assert [r.path for r in fake_hub.requests(older.repo_id)] == [f"/api/models/{older.repo_id}"]
    assert fake_hub.requests(newer.repo_id) == []


def test_beat_sync_does_nothing_while_another_run_holds_the_lock(three_repos: list[str]) -> None:
    with single_running("hub.sync_stalest", ttl=60) as mine:
        assert mine
        assert sync_stalest_repos(limit=10) == 0
    assert not HubModel.objects.filter(status=ModelStatus.OK).exists()


def test_refresh_watches_tracks_new_repos(three_repos: list[str], fake_hub: FakeHub) -> None:
    fake_hub.store.create_repo("acme/d")
    Watch.objects.create(kind=WatchKind.AUTHOR, author="acme")
    assert refresh_watches(limit=5) == 1
    assert HubModel.objects.get(repo_id="acme/d").tracked_via == "watch"
    assert refresh_watches(limit=5) == 0


def test_sync_repo_of_a_deleted_row_does_nothing(hub_settings: Any) -> None:
    assert sync_repo(123456) == "gone"


def test_sync_repo_raises_for_a_retry_when_the_hub_is_down(
    three_repos: list[str], fake_hub: FakeHub, hub_settings: Any
) -> None:
    hub_settings.HF_MAX_ATTEMPTS = 1
    fake_hub.inject("500", times=5)
    model = HubModel.objects.get(repo_id="acme/a")
    with pytest.raises(HubUnavailable):
        sync_repo(model.pk)
    assert "500" in HubModel.objects.get(pk=model.pk).sync_error


def test_sync_repo_notes_a_failure_no_sync_expects_on_the_model(
    three_repos: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a batch notes it (`sync_failed`): the task ends, and the model's page says why."""
    from registry.sync import RegistrySync

    def failing(self: RegistrySync, model: HubModel, **options: Any) -> Any:
        raise RuntimeError("a bug in reading")

    monkeypatch.setattr(RegistrySync, "look", failing)
    model = HubModel.objects.get(repo_id="acme/a")
    assert sync_repo(model.pk) == "failed"
    assert HubModel.objects.get(pk=model.pk).sync_error == (
        "sync failed syncing the repo (RuntimeError); the last good sync is kept"
    )


def test_a_watch_queues_its_new_repos_first_syncs_in_batches(
    fake_hub: FakeHub, hub_settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    for number in range(SYNC_BATCH + 5):
        fake_hub.store.create_repo(f"many/m{number:02}")
    Watch.objects.create(kind=WatchKind.AUTHOR, author="many", limit=100)
    with django_capture_on_commit_callbacks() as callbacks:
        assert refresh_watches(limit=5) == SYNC_BATCH + 5
    # Each is `registry.jobs.enqueue_on_commit`'s send: partial(send, task, args, kwargs).
    batches = [c.args[1][0] for c in callbacks if getattr(c, "args", ())[:1] == ("hub.sync_repos",)]
    assert [len(b) for b in batches] == [SYNC_BATCH, 5]
    tracked = HubModel.objects.filter(repo_id__startswith="many/")
    assert sorted(pk for b in batches for pk in b) == sorted(tracked.values_list("pk", flat=True))
    assert not any(getattr(c, "args", ())[:1] == ("hub.sync_repo",) for c in callbacks)


# Four threads at a time (REGISTRY_SYNC_CONCURRENCY), each with its own connection.
@pytest.mark.django_db(transaction=True)
def test_sync_repos_syncs_a_batch_and_retries_only_what_failed(
    three_repos: list[str], fake_hub: FakeHub, hub_settings: Any
) -> None:
    pks = list(HubModel.objects.order_by("repo_id").values_list("pk", flat=True))
    assert sync_repos(pks) == 3
    assert set(HubModel.objects.values_list("status", flat=True)) == {ModelStatus.OK}
    hub_settings.HF_MAX_ATTEMPTS = 1
    fake_hub.inject("500", times=5, match="/api/models/acme/b")
    # Called directly (no worker), the retry raises its reason; a worker would queue it again
    # with only acme/b (tests/test_sync_concurrency.py checks which).
    with pytest.raises(HubUnavailable, match="1 of 3 repos to sync again"):
        sync_repos(pks, force=True)
