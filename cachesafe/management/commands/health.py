"""`manage.py health [COMPONENT]`: exit 0 when alive, 1 when not (for container healthchecks)."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workers.health import service_status

COMPONENTS = ("all", "database", "broker", "worker", "beat", "probe_worker")


class Command(BaseCommand):
    help = "Print the service status as JSON; exit 1 when the component named is not alive."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("component", nargs="?", default="all", choices=COMPONENTS)

    def handle(self, *args: Any, **options: Any) -> None:
        status = service_status()
        self.stdout.write(json.dumps(status.as_json(), indent=2))
        component = options["component"]
        alive = status.healthy if component == "all" else getattr(status, component).ok
        if not alive:
            sys.exit(1)
