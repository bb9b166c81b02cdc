"""Strict parsers for configuration read from the environment.

Every parser raises ``ConfigError`` with a message that names the variable and says what to
fix, so a bad value stops the service with one readable line instead of a traceback later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class ConfigError(ValueError):
    """A configuration value is missing or malformed."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Env:
    """A read-only view of the environment with typed, strict accessors."""

    values: Mapping[str, str]

    @classmethod
    def from_os(cls) -> Env:
        return cls(dict(os.environ))

    def is_set(self, name: str) -> bool:
        return bool(self.values.get(name, "").strip())

    def text(self, name: str, default: str) -> str:
        value = self.values.get(name, "").strip()
        return value or default

    def flag(self, name: str, default: bool) -> bool:
        raw = self.values.get(name, "").strip().lower()
        if not raw:
            return default
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r} is not a boolean: use one of true/false, 1/0, yes/no")

    def integer(self, name: str, default: int, *, minimum: int = 0, maximum: int = 2**31) -> int:
        raw = self.values.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise ConfigError(f"{name}={value} is out of range ({minimum}..{maximum})")
        return value

    def integers(self, name: str, default: list[int]) -> list[int]:
        raw = self.items(name, [])
        if not raw:
            return list(default)
        try:
            return [int(item) for item in raw]
        except ValueError:
            raise ConfigError(f"{name}={','.join(raw)!r} is not a list of whole numbers") from None

    def items(self, name: str, default: list[str]) -> list[str]:
        raw = self.values.get(name, "").strip()
        if not raw:
            return list(default)
        return [item.strip() for item in raw.split(",") if item.strip()]


def parse_database_url(url: str, *, base_dir: Path) -> dict[str, Any]:
    """Turn ``postgres://user:pass@host:port/name`` or ``sqlite:///path`` into Django settings."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ConfigError(
                f"DATABASE_URL={_redact(url)} names no database: add one, "
                "e.g. postgres://postgres@127.0.0.1:5432/cachesafe"
            )
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"DATABASE_URL={_redact(url)} has a bad port") from None
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        return {
            # Django's, with a health check that sends no query (cachesafe/db/base.py).
            "ENGINE": "cachesafe.db",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": {"connect_timeout": 5, **options},
        }
    if scheme == "sqlite":
        path = unquote(parts.path)
        if url.startswith("sqlite:////"):
            file = Path("/" + path.lstrip("/"))
        elif path in {"", "/"}:
            raise ConfigError("DATABASE_URL=sqlite:// needs a file, e.g. sqlite:///var/db.sqlite3")
        else:
            file = base_dir / path.lstrip("/")
        return sqlite_database(file)
    raise ConfigError(
        f"DATABASE_URL={_redact(url)} has an unsupported scheme {scheme or '(none)'!r}: "
        "use postgres://user@host:port/name or sqlite:///relative/path.sqlite3"
    )


def sqlite_database(file: Path) -> dict[str, Any]:
    """Settings for the embedded SQLite database, tuned for one web and two Celery processes."""
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(file),
        "OPTIONS": {
            # WAL lets the web server read while a worker writes; IMMEDIATE takes the write
            # lock at BEGIN so concurrent writers queue instead of failing mid-transaction.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
        # Kept open between a worker's tasks and a web process's requests: opening one (and
        # running the PRAGMAs) costs more than many a sync's queries.
        "CONN_MAX_AGE": 60,
        # A file, not memory, so worker processes started by the tests share the test database.
        "TEST": {"NAME": str(file.with_name(f"test_{file.name}"))},
    }


def check_redis_url(url: str) -> str:
    """Validate a ``redis://`` / ``rediss://`` URL and return it unchanged."""
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss"} or not parts.hostname:
        raise ConfigError(
            f"REDIS_URL={_redact(url)} is not a Redis URL: use redis://127.0.0.1:6379/0"
        )
    try:
        parts.port  # noqa: B018 - raises on a non-numeric port
    except ValueError:
        raise ConfigError(f"REDIS_URL={_redact(url)} has a bad port") from None
    return url


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url
