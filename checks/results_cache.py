"""Finished reports keyed by (template sha256, tokenizer sha256, engine version, options).

Re-checking an unchanged template costs a dictionary lookup. Callers plug in their own store by
implementing `get` and `put` (the Django side can back it with the database).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol


class ResultCache(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, report: dict[str, Any]) -> None: ...


def cache_key(
    template_sha256: str,
    tokenizer_sha256: str | None,
    engine_version: str,
    special_tokens: dict[str, str],
    options: dict[str, Any],
) -> str:
    """Everything that can change a report, hashed; the file name is deliberately not part of it."""
    material = json.dumps(
        [template_sha256, tokenizer_sha256, engine_version, special_tokens, options],
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()


class MemoryResultCache:
    """An in-process LRU; the default."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self.hits = 0
        self._reports: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._reports)

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            report = self._reports.get(key)
            if report is not None:
                self._reports.move_to_end(key)
                self.hits += 1
            return report

    def put(self, key: str, report: dict[str, Any]) -> None:
        with self._lock:
            self._reports[key] = report
            if len(self._reports) > self.size:
                self._reports.popitem(last=False)


class DirectoryResultCache:
    """One JSON file per key in a directory; survives across CLI runs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.hits = 0

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        self.hits += 1
        return data

    def put(self, key: str, report: dict[str, Any]) -> None:
        """Keep `report` for `key`; a directory that cannot take it (full, read-only, a file
        by that name) keeps nothing, and the check's result is still given."""
        tmp = ""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a concurrent reader never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(report, handle)
            os.replace(tmp, self._path(key))
        except OSError:
            if tmp:  # a write cut short (a full disk) leaves no half file behind
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
