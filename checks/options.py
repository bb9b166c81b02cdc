"""What a check runs with: the engine's version and the options that change its results.

Both are part of every result's cache key. Light on purpose (no Jinja): the CLI and the service
read them before any sandbox worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Bump whenever results could change: cached results of another version are not reused.
ENGINE_VERSION = "1.2.4"

# The clock `strftime_now` reads unless the caller pins another one: a check must not change daily.
DEFAULT_NOW = datetime(2026, 1, 15, 9, 30, 0)

DEFAULT_MAX_OUTPUT_CHARS = 4 * 1024 * 1024


@dataclass(frozen=True)
class CheckOptions:
    now: datetime = DEFAULT_NOW
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS

    def to_dict(self) -> dict[str, Any]:
        return {"now": self.now.isoformat(), "max_output_chars": self.max_output_chars}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckOptions:
        return cls(datetime.fromisoformat(data["now"]), int(data["max_output_chars"]))
