from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.hub import HubClient, HubUnavailable, RepoUnavailable
from registry.models import Watch, WatchKind
from registry.watching import refresh_watch


class Command(BaseCommand):
    help = (
        "Watch an author or organisation, or a Hub query (top N by downloads), so that new "
        "repos get tracked as they appear. Without options, lists the watches."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--author", help="an author or organisation, e.g. mlx-community")
        parser.add_argument("--search", default="", help="a Hub search string")
        parser.add_argument("--pipeline-tag", default="", help="e.g. text-generation")
        parser.add_argument("--sort", default="downloads", help="downloads, likes, lastModified")
        parser.add_argument("--limit", type=int, default=100, help="at most this many repos")
        parser.add_argument("--remove", type=int, metavar="ID", help="stop a watch")
        parser.add_argument(
            "--refresh", action="store_true", help="query the Hub now and track new repos"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["remove"] is not None:
            deleted, _ = Watch.objects.filter(pk=options["remove"]).delete()
            if not deleted:
                raise CommandError(f"no watch {options['remove']}")
            self.stdout.write(f"watch {options['remove']} removed")
            return
        if not 1 <= options["limit"] <= 10_000:
            raise CommandError("--limit must be between 1 and 10000")
        if options["author"] or options["search"] or options["pipeline_tag"]:
            watch, created = Watch.objects.get_or_create(
                kind=WatchKind.AUTHOR if options["author"] else WatchKind.QUERY,
                author=(options["author"] or "").strip(),
                search=options["search"].strip(),
                pipeline_tag=options["pipeline_tag"].strip(),
                sort=options["sort"],
                limit=options["limit"],
            )
            self.stdout.write(f"watch {watch.pk}: {watch} ({'added' if created else 'exists'})")
            watches = [watch] if options["refresh"] else []
        else:
            watches = list(Watch.objects.all()) if options["refresh"] else []
            if not options["refresh"]:
                for watch in Watch.objects.all():
                    self.stdout.write(f"watch {watch.pk}: {watch}, last run {watch.last_run_at}")
        client = HubClient() if watches else None
        for watch in watches:
            assert client is not None
            try:
                new = refresh_watch(watch, client)
            except (HubUnavailable, RepoUnavailable) as err:
                raise CommandError(f"watch {watch.pk}: {err}") from None
            self.stdout.write(f"watch {watch.pk}: {len(new)} new repo(s) tracked")
