"""Entry point for `python -m checks`."""

from __future__ import annotations

import sys

from checks.cli import main

sys.exit(main())
