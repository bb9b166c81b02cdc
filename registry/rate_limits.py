"""Rate limits: one token bucket per Hub credential shared by every worker, and a fixed-window
limit for what strangers can trigger (tracking a repo through the API).

With `REDIS_URL` the bucket is a Lua script in Redis (atomic across processes and machines);
without it the embedded defaults keep it in the database cache, best effort (one machine)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from django.conf import settings
from django.core.cache import cache

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


class RedisBucket:
    def __init__(
        self,
        name: str,
        rate: float,
        capacity: float,
        url: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        import redis

        self.key = f"cachesafe:hub-bucket:{name}"
        self.block_key = f"{self.key}:blocked"
        self.rate, self.capacity, self.clock = rate, capacity, clock
        self.client = redis.Redis.from_url(url)
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


class CacheBucket:
    """The same bucket in Django's cache; not atomic across processes (embedded mode only)."""

    def __init__(
        self, name: str, rate: float, capacity: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.key = f"hub-bucket:{name}"
        self.block_key = f"{self.key}:blocked"
        self.rate, self.capacity, self.clock = rate, capacity, clock

    def take(self) -> float:
        now = self.clock()
        blocked = float(cache.get(self.block_key) or 0.0)
        if blocked > now:
            return blocked - now
        state: Any = cache.get(self.key)
        tokens, stamp = state if isinstance(state, tuple) else (self.capacity, now)
        tokens = min(self.capacity, tokens + max(0.0, now - stamp) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        cache.set(self.key, (tokens, now), timeout=int(self.capacity / self.rate) + 60)
        return wait

    def block(self, seconds: float) -> None:
        until = self.clock() + seconds
        if float(cache.get(self.block_key) or 0.0) < until:
            cache.set(self.block_key, until, timeout=int(seconds) + 2)


def hub_bucket(token: str | None, clock: Callable[[], float] = time.time) -> Bucket:
    """The bucket of this credential: Redis when configured, the database cache otherwise."""
    default = DEFAULT_PER_5MIN_TOKEN if token else DEFAULT_PER_5MIN_ANONYMOUS
    per_5min = float(settings.HF_REQUESTS_PER_5MIN or default)
    rate = per_5min / 300.0
    # Bursts of up to a tenth of the window: a sync of one repo needs a handful at once.
    capacity = max(1.0, min(100.0, per_5min / 10.0))
    name = credential_key(token)
    if settings.REDIS_URL:
        return RedisBucket(name, rate, capacity, settings.REDIS_URL, clock)
    return CacheBucket(name, rate, capacity, clock)


def reset_hub_bucket(token: str | None) -> None:
    """Forget a credential's bucket and any 429 pause (tests; or an operator after a quota bump)."""
    name = credential_key(token)
    if settings.REDIS_URL:
        import redis

        key = f"cachesafe:hub-bucket:{name}"
        redis.Redis.from_url(settings.REDIS_URL).delete(key, f"{key}:blocked")
    cache.delete_many([f"hub-bucket:{name}", f"hub-bucket:{name}:blocked"])


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
        cache.add(cache_key, 0, timeout=window_seconds + 5)
        try:
            count = cache.incr(cache_key)
        except ValueError:  # expired between add and incr
            cache.set(cache_key, 1, timeout=window_seconds + 5)
            count = 1
    except Exception as exc:  # any backend error (redis ConnectionError, a timeout, …)
        raise RateLimitUnavailable(f"rate limits unavailable: {exc}") from exc
    return count <= limit
