"""Rate limits: one token bucket per Hub credential shared by every worker, and a fixed-window
limit for what strangers can trigger (tracking a repo through the API).

With `REDIS_URL` the bucket is a Lua script in Redis (atomic across processes and machines);
without it the embedded defaults keep it in a file under VAR_DIR, locked (one machine)."""

from __future__ import annotations

import fcntl
import hashlib
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches

#: Requests per 5 minutes the Hub allows: its documented API quota for free accounts,
#: halved for anonymous use. Override with HF_REQUESTS_PER_5MIN.
DEFAULT_PER_5MIN_TOKEN = 1000
DEFAULT_PER_5MIN_ANONYMOUS = 500


def credential_key(token: str | None) -> str:
    """Buckets are per credential; the key never contains the token itself."""
    if not token:
        return "anonymous"
    return hashlib.sha256(token.encode()).hexdigest()[:16]


class Bucket(Protocol):
    def take(self) -> float:
        """Take a token: return 0.0, or the seconds to wait before trying again."""
        ...

    def block(self, seconds: float) -> None:
        """Stop everyone using this credential for `seconds` (the Hub said so with a 429)."""
        ...


_REDIS_TAKE = """
local now = tonumber(ARGV[3])
local blocked = tonumber(redis.call('GET', KEYS[2]) or '0')
if blocked > now then return tostring(blocked - now) end
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 60)
return tostring(wait)
"""


_redis_clients: dict[str, Any] = {}
_redis_clients_lock = threading.Lock()


def redis_client(url: str) -> Any:
    """This process's client of the Redis at `url`, and its connection pool. A client per
    bucket cost a connection per task (each sync task makes its own Hub client): a first
    token took 1.3 ms on a new connection, 0.19 ms on a pooled one. redis-py's pool is
    thread-safe and starts afresh in a forked process."""
    with _redis_clients_lock:
        client = _redis_clients.get(url)
        if client is None:
            import redis

            client = _redis_clients[url] = redis.Redis.from_url(url)
        return client


class RedisBucket:
    def __init__(
        self,
        name: str,
        rate: float,
        capacity: float,
        url: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.key = f"cachesafe:hub-bucket:{name}"
        self.block_key = f"{self.key}:blocked"
        self.rate, self.capacity, self.clock = rate, capacity, clock
        self.client = redis_client(url)
        self.script = self.client.register_script(_REDIS_TAKE)

    def take(self) -> float:
        result = self.script(
            keys=[self.key, self.block_key], args=[self.rate, self.capacity, self.clock()]
        )
        return float(result)

    def block(self, seconds: float) -> None:
        until = self.clock() + seconds
        # A synchronous client: its answer is bytes or None (redis-py types every command as
        # possibly awaitable).
        current: Any = self.client.get(self.block_key)
        if current is None or float(current) < until:
            self.client.set(self.block_key, repr(until), ex=int(seconds) + 2)


class FileBucket:
    """The same bucket in a small file, changed under an exclusive lock (`flock`): atomic across
    the processes of one machine, which is where the embedded defaults run. A take costs a few
    system calls; in the database cache it cost a write transaction of its own.

    Our own rather than a library's: the state is three numbers, and the file is opened for each
    take because a lock taken on a descriptor a forked worker inherited would be shared."""

    _STATE = struct.Struct("<ddd")  # tokens, when they were counted, blocked until

    def __init__(
        self,
        name: str,
        rate: float,
        capacity: float,
        folder: Path,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = folder / f"hub-bucket-{name}"
        self.rate, self.capacity, self.clock = rate, capacity, clock

    @contextmanager
    def _state(self) -> Iterator[list[float]]:
        """The state, locked; what the caller leaves in the list is written back."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, self._STATE.size, 0)
            now = self.clock()
            # A new file, or one cut short by a crash: a full bucket, as after a long pause.
            state = list(self._STATE.unpack(raw)) if len(raw) == self._STATE.size else []
            if len(state) != 3 or not all(math.isfinite(v) for v in state):
                state = [self.capacity, now, 0.0]
            yield state
            os.pwrite(fd, self._STATE.pack(*state), 0)
        finally:
            os.close(fd)  # and with it the lock

    def take(self) -> float:
        with self._state() as state:
            tokens, stamp, blocked = state
            now = self.clock()
            if blocked > now:
                return blocked - now
            tokens = min(self.capacity, tokens + max(0.0, now - stamp) * self.rate)
            wait = 0.0
            if tokens >= 1:
                tokens -= 1
            else:
                wait = (1 - tokens) / self.rate
            state[:] = [tokens, now, blocked]
            return wait

    def block(self, seconds: float) -> None:
        with self._state() as state:
            state[2] = max(state[2], self.clock() + seconds)

    def reset(self) -> None:
        self.path.unlink(missing_ok=True)


def bucket_folder() -> Path:
    return Path(settings.VAR_DIR) / "buckets"


def hub_bucket(token: str | None, clock: Callable[[], float] = time.time) -> Bucket:
    """The bucket of this credential: Redis when configured, else a locked file under VAR_DIR."""
    default = DEFAULT_PER_5MIN_TOKEN if token else DEFAULT_PER_5MIN_ANONYMOUS
    per_5min = float(settings.HF_REQUESTS_PER_5MIN or default)
    rate = per_5min / 300.0
    # Bursts of up to a tenth of the window: a sync of one repo needs a handful at once.
    capacity = max(1.0, min(100.0, per_5min / 10.0))
    name = credential_key(token)
    if settings.REDIS_URL:
        return RedisBucket(name, rate, capacity, settings.REDIS_URL, clock)
    return FileBucket(name, rate, capacity, bucket_folder(), clock)


def reset_hub_bucket(token: str | None) -> None:
    """Forget a credential's bucket and any 429 pause (tests; or an operator after a quota bump)."""
    name = credential_key(token)
    if settings.REDIS_URL:
        key = f"cachesafe:hub-bucket:{name}"
        redis_client(settings.REDIS_URL).delete(key, f"{key}:blocked")
    FileBucket(name, 1.0, 1.0, bucket_folder()).reset()


def _window_key(key: str, window_seconds: int) -> str:
    return f"ratelimit:{key}:{int(time.time() // window_seconds)}"


def forget(key: str, window_seconds: int) -> None:
    """Reset `key`'s count in the current window."""
    cache.delete(_window_key(key, window_seconds))


class RateLimitUnavailable(Exception):
    """The shared cache that counts requests cannot be reached: the caller answers 503 with
    `Retry-After` rather than let strangers through uncounted (or fail with a 500)."""

    retry_after = 30


def allow(key: str, limit: int, window_seconds: int) -> bool:
    """Fixed-window counter in the shared cache: True while `key` stays within `limit`.

    Raises RateLimitUnavailable when the cache (Redis in production) is down."""
    cache_key = _window_key(key, window_seconds)
    try:
        with _counting():
            cache.add(cache_key, 0, timeout=window_seconds + 5)
            try:
                count = cache.incr(cache_key)
            except ValueError:  # expired between add and incr
                cache.set(cache_key, 1, timeout=window_seconds + 5)
                count = 1
    except Exception as exc:  # any backend error (redis ConnectionError, a timeout, …)
        raise RateLimitUnavailable(f"rate limits unavailable: {exc}") from exc
    return count <= limit


@contextmanager
def _counting() -> Iterator[None]:
    """Redis counts atomically (INCR). Any other cache, as the embedded defaults' database
    cache, increments by a read then a write, so concurrent requests each read the same count:
    24 sign-in requests at once sent 5 to 7 mails against a limit of 5. Those counts are
    taken one at a time, under a lock on a file under VAR_DIR (the embedded defaults run on
    one machine), which `flock` holds against other threads as well as other processes."""
    from django.core.cache.backends.redis import RedisCache

    if isinstance(caches[DEFAULT_CACHE_ALIAS], RedisCache):
        yield
        return
    folder = bucket_folder()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "window-counts.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock
