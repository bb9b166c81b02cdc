"""Loaded with `-p tests.bootstrap` before Django settings: isolates the test run's environment.

The Hub client reads its variables at import time and the settings derive every embedded path
from CACHESAFE_VAR_DIR, so both must be set before anything imports them.
"""

from __future__ import annotations

import os
import tempfile

os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="cachesafe-hf-")
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_TOKEN"] = ""
os.environ.pop("HUGGING_FACE_HUB_TOKEN", None)
# A folder of its own, so a test run never shares the embedded broker or database of `make run`.
os.environ.setdefault("CACHESAFE_VAR_DIR", tempfile.mkdtemp(prefix="cachesafe-test-var-"))
