"""Mark an address bounced: every email channel with it stops, with the reason shown."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from alerts.models import Channel, ChannelKind


class Command(BaseCommand):
    help = "Disable the email channels of an address that bounced (the owner sees the reason)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("address")
        parser.add_argument("--reason", default="the address bounced")

    def handle(self, *args: Any, address: str, reason: str, **options: Any) -> None:
        channels = Channel.objects.filter(
            kind=ChannelKind.EMAIL, address__iexact=address, disabled_at__isnull=True
        )
        count = 0
        for channel in channels:
            channel.disable(reason)
            count += 1
        self.stdout.write(f"disabled {count} channel(s) for {address}")
