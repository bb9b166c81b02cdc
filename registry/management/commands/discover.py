from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.discovery import discover, progress, sync_new
from registry.hub import HubClient
from registry.sync import SyncResult


class Command(BaseCommand):
    help = (
        "Track the Hub's most used chat models (DISCOVERY_* settings: top DISCOVERY_LIMIT by "
        "downloads and by trending, per pipeline tag, tagged conversational). Their first "
        "syncs go to the worker, or run here with --sync."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--sync",
            action="store_true",
            help="sync the new repos here, --concurrency at a time, instead of queueing them",
        )
        parser.add_argument("--concurrency", type=int, default=4, help="with --sync (1-16)")
        parser.add_argument(
            "--limit", type=int, help=f"repos per query (default {settings.DISCOVERY_LIMIT})"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["concurrency"] <= 16:
            raise CommandError("--concurrency must be between 1 and 16")
        if options["limit"] is not None and not 1 <= options["limit"] <= 10_000:
            raise CommandError("--limit must be between 1 and 10000")
        client = HubClient()
        self.stdout.write(f"Asking {client.endpoint} for the most used chat models …")
        run = discover(
            client, trigger="command", queue_syncs=not options["sync"], limit=options["limit"]
        )
        self.stdout.write(f"{run.listed} repos listed, {run.new} new, now tracked")
        if run.error:
            raise CommandError(run.error)
        if not options["sync"]:
            self.stdout.write("Their first syncs are queued; the catalog shows the progress.")
            return
        done = 0

        def report(result: SyncResult) -> None:
            nonlocal done
            done += 1
            if result.outcome == "failed" or done % 25 == 0 or done == run.new:
                self.stdout.write(f"[{done}/{run.new}] {result.line()}")

        results = sync_new(run, concurrency=options["concurrency"], on_result=report)
        state = progress(run)
        failed = sum(r.outcome == "failed" for r in results)
        self.stdout.write(
            f"{state.read} of {run.new} new repos read"
            + (f"; {failed} failed (retried by the next sync)" if failed else "")
        )
