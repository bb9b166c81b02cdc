"""The Hub token bucket (one per credential, shared by workers) and the per-address limit."""

from __future__ import annotations

import multiprocessing
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from registry import rate_limits
from registry.hub import HubClient, HubUnavailable
from registry.models import HubModel
from registry.sync import RegistrySync
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import Sleeps, fake_hub, hub_settings

pytestmark = pytest.mark.django_db
__all__ = ["fake_hub", "hub_settings"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def buckets(clock: FakeClock, folder: Path) -> list[rate_limits.Bucket]:
    name = uuid.uuid4().hex  # Redis is shared with other test runs: a bucket of our own
    found: list[rate_limits.Bucket] = [rate_limits.FileBucket(name, 1.0, 3.0, folder, clock)]
    if settings.REDIS_URL:
        found.append(rate_limits.RedisBucket(name, 1.0, 3.0, settings.REDIS_URL, clock))
    return found


def test_bucket_allows_a_burst_then_one_per_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    for bucket in buckets(clock, tmp_path):
        assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
        assert bucket.take() == pytest.approx(1.0)
        clock.now += 1.0
        assert bucket.take() == 0.0
        clock.now += 0.5
        assert bucket.take() == pytest.approx(0.5)


def test_a_429_blocks_every_user_of_the_credential(tmp_path: Path) -> None:
    clock = FakeClock()
    for bucket in buckets(clock, tmp_path):
        bucket.block(30)
        assert bucket.take() == pytest.approx(30.0)
        clock.now += 31
        assert bucket.take() == 0.0


def _take_all(folder: Path, takes: int) -> int:
    """In another process: how many of `takes` tokens this process got at once."""
    bucket = rate_limits.FileBucket("shared", 0.001, 200.0, folder, clock=lambda: 1e6)
    return sum(bucket.take() == 0.0 for _ in range(takes))


def test_the_embedded_bucket_is_atomic_across_processes(tmp_path: Path) -> None:
    """Four processes take 100 tokens each, at once, from a bucket of 200 (with no refill): 200
    are granted in all, none twice. A read-modify-write without the lock grants more."""
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(4, mp_context=context) as pool:
        granted = list(pool.map(_take_all, [tmp_path] * 4, [100] * 4))
    assert sum(granted) == 200, granted


def test_a_damaged_bucket_file_starts_full(tmp_path: Path) -> None:
    bucket = rate_limits.FileBucket("b", 1.0, 2.0, tmp_path, clock=lambda: 5.0)
    bucket.path.write_bytes(b"\x00" * 5)  # cut short
    assert [bucket.take(), bucket.take()] == [0.0, 0.0]
    assert bucket.take() == pytest.approx(1.0)
    bucket.path.write_bytes(rate_limits.FileBucket._STATE.pack(float("nan"), 0.0, 0.0))
    assert bucket.take() == 0.0


def test_workers_with_one_credential_share_one_bucket(fake_hub: FakeHub, hub_settings: Any) -> None:
    """Two clients (two workers) with the same token wait for each other; another token not."""
    hub_settings.HF_REQUESTS_PER_5MIN = 300  # one a second, bursts of 30
    fake_hub.store.create_repo("acme/m")
    fake_hub.store.add_commit(
        "acme/m", {"tokenizer_config.json": tokenizer_config(b"x", None, None)}
    )
    first, second, other = Sleeps(), Sleeps(), Sleeps()
    clients = [
        HubClient(token="hf_a", sleep=first, clock=lambda: 5e6),
        HubClient(token="hf_a", sleep=second, clock=lambda: 5e6),
        HubClient(token="hf_b", sleep=other, clock=lambda: 5e6),
    ]
    for _ in range(15):
        clients[0].model_info("acme/m")
        clients[1].model_info("acme/m")
    with pytest.raises(Exception, match="rate limit"):
        # The clock is frozen, so waiting never refills the shared bucket: it gives up.
        clients[1].model_info("acme/m")
    clients[2].model_info("acme/m")
    assert other == []


def test_429_on_one_worker_pauses_the_other(fake_hub: FakeHub, hub_settings: Any) -> None:
    fake_hub.store.create_repo("acme/m")
    fake_hub.store.add_commit(
        "acme/m", {"tokenizer_config.json": tokenizer_config(b"x", None, None)}
    )
    fake_hub.inject("429", times=1, retry_after=20)
    clock = FakeClock()
    first: list[float] = []
    second: list[float] = []

    def second_sleeps(seconds: float) -> None:
        second.append(seconds)
        clock.now += seconds

    worker_b = HubClient(sleep=second_sleeps, clock=clock)

    def first_sleeps(seconds: float) -> None:
        # While worker A waits out its 429, worker B asks the Hub too: it must wait as well.
        first.append(seconds)
        worker_b.model_info("acme/m")

    worker_a = HubClient(sleep=first_sleeps, clock=clock)
    worker_a.model_info("acme/m")
    assert first == [21.0]
    assert second == [pytest.approx(21.0)]
    statuses = [r.status for r in fake_hub.requests("acme/m")]
    assert statuses == [429, 200, 200]


def test_sync_counts_every_request_through_the_bucket(fake_hub: FakeHub, hub_settings: Any) -> None:
    fake_hub.store.create_repo("acme/m")
    fake_hub.store.add_commit(
        "acme/m", {"tokenizer_config.json": tokenizer_config(b"x", None, None)}
    )
    client = HubClient(sleep=Sleeps())
    RegistrySync(client).sync(HubModel.objects.track("acme/m", via="track")[0])
    assert client.requests == len(fake_hub.requests("acme/m"))


def test_per_address_limit_counts_within_a_window() -> None:
    key = f"test:{uuid.uuid4().hex}"
    assert [rate_limits.allow(key, 2, 60) for _ in range(3)] == [True, True, False]


def test_credentials_are_never_stored_in_keys() -> None:
    assert rate_limits.credential_key(None) == "anonymous"
    assert "hf_secret" not in rate_limits.credential_key("hf_secret")


def test_hub_clients_share_one_redis_connection(settings: Any) -> None:
    """Each sync task makes its own Hub client; its bucket's Redis connection is the
    process's, not a new one (a first take on a new connection cost 1.3 ms, on a pooled one
    0.19)."""
    if not settings.REDIS_URL:
        pytest.skip("the embedded bucket is a file: no connection to share")
    import redis

    observer = redis.Redis.from_url(settings.REDIS_URL)

    def connections() -> int:
        """Connections Redis has accepted so far (from anyone)."""
        stats: Any = observer.info("stats")  # a synchronous client: a dict
        return int(stats["total_connections_received"])

    rate_limits.hub_bucket(None).take()  # this process's connection, once
    before = connections()
    for _ in range(20):
        rate_limits.hub_bucket(None).take()
        HubClient(token="hf_a").bucket.take()
    assert connections() - before <= 2  # another client's reconnect, at most
    observer.close()


@pytest.mark.django_db(transaction=True)
def test_the_embedded_database_cache_counts_concurrent_requests_one_at_a_time(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded defaults count in the database cache, whose increment is a read then a
    write: 24 sign-in requests at once sent 5 to 7 mails against a limit of 5. Each thread
    here reads the count slowly, as a loaded database would; no more than the limit pass."""
    import threading
    import time

    from django.core.cache import caches
    from django.core.cache.backends.db import DatabaseCache
    from django.core.management import call_command

    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "test_window_counts",
        }
    }
    settings.VAR_DIR = tmp_path
    call_command("createcachetable", verbosity=0)
    assert isinstance(caches["default"], DatabaseCache)
    read = DatabaseCache.get

    def slow_read(self: DatabaseCache, *args: Any, **kwargs: Any) -> Any:
        value = read(self, *args, **kwargs)
        time.sleep(0.02)  # every thread reads before any writes, unless they take turns
        return value

    monkeypatch.setattr(DatabaseCache, "get", slow_read)
    key = f"test:{uuid.uuid4().hex}"
    start = threading.Barrier(12)
    passed: list[bool] = []

    def request() -> None:
        from django.db import connection

        try:
            start.wait()
            passed.append(rate_limits.allow(key, 5, 3600))
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(passed) == [False] * 7 + [True] * 5


def test_a_429_too_long_to_wait_out_pauses_every_worker_too(
    fake_hub: FakeHub, hub_settings: Any
) -> None:
    """A wait longer than a worker sleeps through (an hour) ends its request at once, and the
    others on the credential must not go on asking meanwhile: before, only waits under two
    minutes were shared."""
    fake_hub.store.create_repo("acme/m")
    fake_hub.store.add_commit(
        "acme/m", {"tokenizer_config.json": tokenizer_config(b"x", None, None)}
    )
    fake_hub.inject("429", times=1, retry_after=3600)
    clock = FakeClock()
    with pytest.raises(HubUnavailable, match="rate limited for") as raised:
        HubClient(sleep=lambda seconds: None, clock=clock).model_info("acme/m")
    assert raised.value.retry_after == 3601.0
    with pytest.raises(HubUnavailable, match="rate limit, retry in") as told:
        HubClient(sleep=lambda seconds: None, clock=clock).model_info("acme/m")
    assert told.value.retry_after == pytest.approx(3601.0)
    assert [r.status for r in fake_hub.requests("acme/m")] == [429]  # the second never asked
