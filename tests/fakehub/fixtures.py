"""Pytest fixtures for the registry's tests: import them into a test module to use them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.rate_limits import reset_hub_bucket

from .corpus import build_corpus_hub
from .server import FakeHub

#: Credentials the tests use; their buckets are reset before each test.
TEST_TOKENS = (None, "hf_granted", "hf_a", "hf_b")


class Sleeps(list[float]):
    """An injected `sleep` that records how long the code wanted to wait, and returns at once;
    `clock` is the wall clock moved on by those waits (for rate-limit buckets)."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)

    def clock(self) -> float:
        return time.time() + sum(self)


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    """An empty fake Hub on a free 127.0.0.1 port."""
    hub = FakeHub().start()
    yield hub
    hub.stop()


@pytest.fixture
def corpus_hub(fake_hub: FakeHub, corpus_dir: Path) -> FakeHub:
    """The fake Hub serving one repo per corpus repo id."""
    build_corpus_hub(fake_hub.store, corpus_dir)
    return fake_hub


@pytest.fixture
def hub_settings(settings: Any, fake_hub: FakeHub) -> Any:
    """Settings pointing the registry at the fake Hub, anonymous, with no rate-limit waits."""
    settings.HF_ENDPOINT = fake_hub.url
    settings.HF_TOKEN = None
    settings.HF_REQUESTS_PER_5MIN = 10**9
    # Buckets are shared state (Redis or the cache): start each test without a leftover pause.
    for token in TEST_TOKENS:
        reset_hub_bucket(token)
    return settings


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()
