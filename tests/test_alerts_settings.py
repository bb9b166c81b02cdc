"""The alert settings: loopback webhooks can never be switched on in production."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT


def settings_error(env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stderr if result.returncode else ""


def test_loopback_webhooks_refuse_to_start_without_debug(embedded_env: dict[str, str]) -> None:
    production = {
        **embedded_env,
        "DJANGO_SETTINGS_MODULE": "cachesafe.settings",
        "DEBUG": "false",
        "SECRET_KEY": "x" * 60,
    }
    assert settings_error(production) == ""
    error = settings_error({**production, "ALERTS_ALLOW_LOOPBACK": "true"})
    assert "ALERTS_ALLOW_LOOPBACK is for local testing" in error
