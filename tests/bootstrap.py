"""Loaded with `-p tests.bootstrap` before Django settings: isolates the test run's environment.

The Hub client reads its variables at import time and the settings derive every embedded path
from CACHESAFE_VAR_DIR, so both must be set before anything imports them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid


def scratch_folder(prefix: str) -> str:
    """A new folder, removed when the run ends: every run made two that stayed behind."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


os.environ["HF_HOME"] = scratch_folder("cachesafe-hf-")
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_TOKEN"] = ""
os.environ.pop("HUGGING_FACE_HUB_TOKEN", None)
# A folder of its own, so a test run never shares the embedded broker or database of `make run`.
if "CACHESAFE_VAR_DIR" not in os.environ:
    os.environ["CACHESAFE_VAR_DIR"] = scratch_folder("cachesafe-test-var-")
# And cache keys of its own in Redis, which outlives a run: a page another run (or `make run`)
# kept there, with the lock of a render that raised, was served to this run's tests as stale
# for the lock's life. Child processes inherit it, so they share this run's keys.
os.environ.setdefault("CACHESAFE_CACHE_PREFIX", f"cachesafe-test-{uuid.uuid4().hex[:12]}")
