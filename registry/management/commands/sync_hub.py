from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.models import validate_repo_id
from registry.sync import sync_repo_ids


class Command(BaseCommand):
    help = (
        "Sync repos with the Hub (HF_ENDPOINT, HF_TOKEN): the named ones (tracking them if "
        "needed), else every tracked repo. One request per repo that did not change."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("repo_ids", nargs="*", metavar="REPO_ID")
        parser.add_argument(
            "--force", action="store_true", help="re-read the bounded history even if unchanged"
        )
        parser.add_argument(
            "--head-only",
            action="store_true",
            help="read new repos' heads only; their history is left to the beat backfill",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            help="repos read at once (1-32); all share the Hub quota",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            repo_ids = [validate_repo_id(r) for r in options["repo_ids"]]
        except ValidationError as err:
            raise CommandError(err.messages[0]) from None
        if not 1 <= options["concurrency"] <= 32:
            raise CommandError("--concurrency must be between 1 and 32")
        results = sync_repo_ids(
            repo_ids or None,
            force=options["force"],
            concurrency=options["concurrency"],
            history=not options["head_only"],
        )
        for result in results:
            self.stdout.write(result.line())
        failed = [r for r in results if r.outcome == "failed"]
        if failed:
            raise CommandError(
                f"{len(failed)} of {len({r.repo_id for r in results})} repo(s) could not be "
                "synced from "
                f"{settings.HF_ENDPOINT}; run again later"
            )
        repos = len({r.repo_id for r in results})
        self.stdout.write(f"synced {repos} repo(s) from {settings.HF_ENDPOINT}")
