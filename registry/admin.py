"""The registry's tables in the admin: read what the sync and the checks wrote, find a model."""

from __future__ import annotations

from django.contrib import admin

from .models import (
    CheckRun,
    HubModel,
    ModelEvent,
    OutboxMessage,
    ProbeRun,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
    Watch,
)


@admin.register(HubModel)
class HubModelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("repo_id", "status", "verdict", "downloads", "last_synced_at", "is_demo")
    list_filter = ("status", "verdict", "is_hybrid", "is_demo", "tracked_via")
    search_fields = ("repo_id", "author", "family")
    raw_id_fields = ("current_snapshot",)
    readonly_fields = ("verdict", "verdict_summary", "verdict_updated_at", "reuse")


@admin.register(TemplateVersion)
class TemplateVersionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("sha256", "size", "first_seen")
    search_fields = ("sha256",)


@admin.register(TemplateSnapshot)
class TemplateSnapshotAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("model", "commit_sha", "source_file", "created_at")
    search_fields = ("model__repo_id", "commit_sha")
    raw_id_fields = ("model", "default_template")


@admin.register(TemplateChange)
class TemplateChangeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("model", "commit_sha", "committed_at", "title")
    search_fields = ("model__repo_id", "commit_sha", "title")
    raw_id_fields = ("model", "old_version", "new_version", "snapshot")


@admin.register(CheckRun)
class CheckRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("template_version", "engine_version", "status", "verdict", "created_at")
    list_filter = ("status", "verdict", "engine_version")
    raw_id_fields = ("template_version",)
    exclude = ("report",)  # large JSON: the template and pair pages show it


@admin.register(ModelEvent)
class ModelEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("created_at", "kind", "summary", "notify_claimed_at")
    list_filter = ("kind",)
    search_fields = ("summary", "model__repo_id")
    raw_id_fields = ("model",)


@admin.register(ProbeRun)
class ProbeRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("model", "commit_sha", "state", "verdict", "queued_at", "finished_at")
    list_filter = ("state", "verdict")
    raw_id_fields = ("model",)
    exclude = ("report",)


@admin.register(Watch)
class WatchAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("__str__", "last_run_at", "last_error")


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """What a broker outage kept: sent by `registry.flush_outbox` when the broker is back."""

    list_display = ("task", "args", "created_at", "attempts", "last_error")
