#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachesafe.settings")
    from cachesafe.environment import ConfigError

    try:
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    except ConfigError as exc:
        # A bad setting is the operator's to fix: one line, no traceback.
        print(f"configuration error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
