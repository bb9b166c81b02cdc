from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from registry.demo import seed_demo_catalog


class Command(BaseCommand):
    help = "Add the demo catalog (templates written for CacheSafe; no Hub access needed)."

    def handle(self, *args: Any, **options: Any) -> None:
        created = seed_demo_catalog()
        self.stdout.write(f"demo catalog: {created} model(s) added")
