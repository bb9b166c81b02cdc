"""Single-running jobs: a lock in the shared cache (Redis in production, the database otherwise)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.cache import cache

logger = logging.getLogger(__name__)


@contextmanager
def single_running(name: str, *, ttl: int) -> Iterator[bool]:
    """Yield True if this caller holds the lock `name`, False if someone else does.

    `ttl` bounds how long a crashed holder can block others; it must exceed the job's hard limit.
    """
    key = f"lock:{name}"
    token = secrets.token_hex(8)
    acquired = bool(cache.add(key, token, timeout=ttl))
    try:
        yield acquired
    finally:
        # Release only our own lock: after a ttl expiry someone else may hold it now.
        if acquired and cache.get(key) == token:
            cache.delete(key)
