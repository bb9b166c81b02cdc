from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.models import HubModel, validate_repo_id


class Command(BaseCommand):
    help = "Track Hub repos by id (owner/name); `sync_hub` or the beat task fills them in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("repo_ids", nargs="+", metavar="REPO_ID")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            repo_ids = [validate_repo_id(r) for r in options["repo_ids"]]
        except ValidationError as err:
            raise CommandError(err.messages[0]) from None
        for repo_id in repo_ids:
            _, created = HubModel.objects.track(repo_id, via="track")
            self.stdout.write(f"{repo_id}: {'tracked' if created else 'already tracked'}")
