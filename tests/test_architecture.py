"""The layers stay one-way and no package grows an import circle (contracts in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_import_runs_up_a_layer_or_closes_a_circle() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_a_web_process_does_not_carry_the_gguf_package() -> None:
    """gguf imports numpy and its writer (about 14 MiB a process); only a sync that reads a GGUF
    header needs it, so it is imported then, not when the site loads. Likewise the Hub client,
    the tasks' modules (tasks are enqueued by name) and the probe's runner: the site only reads
    what they wrote."""
    code = (
        "import sys, django; django.setup(); "
        "import cachesafe.urls, registry.receivers, alerts.receivers, dashboard.views; "
        "print(sorted(m for m in ('gguf', 'numpy', 'huggingface_hub', 'httpx2', 'registry.tasks', "
        "'alerts.tasks', 'probe.runner') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "cachesafe.settings"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_cli_and_a_sandbox_worker_import_only_what_they_run() -> None:
    """`python -m checks` starts its sandbox workers after its own imports, and each worker
    imports the engine before it can take a job: the parent never renders (no Jinja), and a
    worker imports the diagnosis and the pair renders only for the first job that needs them."""
    code = (
        "import sys, importlib; importlib.import_module(sys.argv[1]); "
        "print(sorted(m for m in ('jinja2', 'checks.engine', 'checks.diagnose', 'checks.pairs', "
        "'concurrent.futures') if m in sys.modules))"
    )

    def imported(module: str) -> str:
        result = subprocess.run(
            [sys.executable, "-c", code, module],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert imported("checks.cli") == "[]"
    assert imported("checks.sandbox_worker") == "['checks.engine', 'jinja2']"
