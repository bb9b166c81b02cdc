from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.local_import import import_local


class Command(BaseCommand):
    help = (
        "Import repos from a folder laid out as on the Hub (DIR/owner/name/tokenizer_config.json "
        "and friends), for air-gapped use. Importing again changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", type=Path, metavar="DIR")

    def handle(self, *args: Any, **options: Any) -> None:
        root: Path = options["directory"]
        if not root.is_dir():
            raise CommandError(f"{root} is not a folder")
        results, problems = import_local(root)
        for problem in problems:
            self.stderr.write(f"skipped {problem}")
        for result in results:
            self.stdout.write(result.line())
        if not results:
            raise CommandError(f"no repo folders found in {root} (expected DIR/owner/name/)")
        self.stdout.write(f"imported {len(results)} repo(s) from {root}")
