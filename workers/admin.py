"""Beat's schedule in the admin: staff change how often a job runs, its arguments, or turn it
off; beat reads the change within seconds (workers/beat.py)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from .models import PeriodicJob
from .schedule import SCHEDULABLE_TASKS, kwargs_errors

#: The fields staff edit; beat writes the others.
EDITABLE = ("task", "every_seconds", "kwargs", "enabled")


class PeriodicJobForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = PeriodicJob
        fields = ("name", "task", "every_seconds", "kwargs", "enabled")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The tasks the schedule knows, and a row's own task if it was copied from elsewhere.
        names = list(SCHEDULABLE_TASKS)
        current = self.instance.task if self.instance.pk else ""
        if current and current not in names:
            names.append(current)
        self.fields["task"] = forms.ChoiceField(choices=[(name, name) for name in names])

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        kwargs = cleaned.get("kwargs")
        task = cleaned.get("task") or self.instance.task
        if isinstance(kwargs, dict):  # anything else: the model says it must be an object
            for error in kwargs_errors(task, kwargs):
                self.add_error("kwargs", error)
        return cleaned


@admin.register(PeriodicJob)
class PeriodicJobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = PeriodicJobForm
    list_display = ("name", "task", "every_seconds", "enabled", "last_run_at", "total_run_count")
    list_editable = ("every_seconds", "enabled")
    list_filter = ("enabled",)
    search_fields = ("name", "task")
    readonly_fields = ("last_run_at", "total_run_count", "edited_at")
    actions = ("turn_on", "turn_off")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A default job is found by its name after every migrate: renamed, it would be written
        # again beside the renamed one, and run twice.
        return (*self.readonly_fields, "name") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: PeriodicJob, form: Any, change: bool) -> None:
        if not change:
            obj.save()
            return
        # Only what the form edits, and the edit's time: beat writes when each job last ran
        # while the page is open, and a whole-row save would put an older time back.
        edited = [name for name in form.fields if name in EDITABLE]
        obj.save(update_fields=[*edited, "edited_at"])

    @admin.action(description="Turn the selected jobs on")
    def turn_on(self, request: HttpRequest, queryset: QuerySet[PeriodicJob]) -> None:
        # `update` skips `auto_now`: set it, or beat would not see the change.
        count = queryset.update(enabled=True, edited_at=timezone.now())
        self.message_user(request, f"{count} jobs on.")

    @admin.action(description="Turn the selected jobs off")
    def turn_off(self, request: HttpRequest, queryset: QuerySet[PeriodicJob]) -> None:
        count = queryset.update(enabled=False, edited_at=timezone.now())
        self.message_user(request, f"{count} jobs off.")
