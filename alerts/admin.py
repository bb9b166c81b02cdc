from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import Channel, Delivery, Digest, Subscription, Team


@admin.action(description="Mark the address bounced (disables the channel)")
def mark_bounced(modeladmin: Any, request: HttpRequest,
                 queryset: QuerySet[Channel]) -> None:  # fmt: skip
    for channel in queryset:
        channel.disable("the address bounced (marked by an administrator)")


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["__str__", "kind", "owner", "team", "confirmed_at", "disabled_at"]
    list_filter = ["kind", "digest"]
    search_fields = ["address", "url", "owner__email"]
    exclude = ["secret"]
    actions = [mark_bounced]


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["__str__", "user", "target", "created_at"]
    raw_id_fields = ["model", "channel", "user"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["event", "channel", "status", "attempts", "response_code", "sent_at"]
    list_filter = ["status"]
    raw_id_fields = ["event", "channel", "digest"]


admin.site.register(Digest)
admin.site.register(Team)
