"""The default beat schedule, written to the database once (`PeriodicJob`); the admin edits it
from there, and beat reads it (`workers.beat`).

No entry names a queue: the routing table in `workers.celery` sends each task by its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models.signals import post_migrate
from django.dispatch import receiver


@dataclass(frozen=True)
class ScheduledJob:
    name: str
    task: str
    every_seconds: int
    kwargs: dict[str, Any]
    #: Intervals this job had by default before: a row still at one of them was never edited,
    #: so it moves to the new default.
    earlier_defaults: tuple[int, ...] = ()


DEFAULT_SCHEDULE: list[ScheduledJob] = [
    ScheduledJob("Dispatch template changes", "workers.dispatch_template_changes", 30, {}),
    # Also re-sends a check whose worker died: within a minute of the death (registry.pipeline).
    ScheduledJob(
        "Check what the engine has not checked",
        "workers.request_missing_checks",
        30,
        {},
        earlier_defaults=(120,),
    ),
    ScheduledJob("Queue probes for the Mac worker", "workers.request_due_probes", 300, {}),
    ScheduledJob("Forget silent workers", "workers.prune_heartbeats", 86400, {}),
    ScheduledJob("Sync the stalest Hub repos", "hub.sync_stalest", 600, {"limit": 200}),
    # A new repo's first sync reads its head only; its history follows here.
    ScheduledJob("Backfill new repos' history", "hub.backfill_history", 120, {"limit": 100}),
    ScheduledJob("Track new repos of watches", "hub.refresh_watches", 3600, {"limit": 50}),
    # Runs only when due (DISCOVERY_EVERY_HOURS since the last run; 0 turns it off).
    ScheduledJob("Discover the Hub's most used chat models", "hub.discover", 3600, {}),
    ScheduledJob("Send what a broker outage kept", "registry.flush_outbox", 15, {}),
    ScheduledJob("Send alerts of new events", "alerts.dispatch_events", 15, {}),
    ScheduledJob("Send daily alert digests", "alerts.send_due_digests", 3600, {}),
]


#: The tasks a schedule row may name, each with the keyword arguments it takes (whole numbers
#: of 1 or more; `tests/test_beat_schedule.py` reads them off the tasks' signatures). The admin
#: refuses any other: the task would refuse it at every run, in a worker's log only.
TASK_KWARGS: dict[str, tuple[str, ...]] = {
    "alerts.dispatch_events": ("limit",),
    "alerts.send_due_digests": ("limit",),
    "hub.backfill_history": ("limit",),
    "hub.discover": (),  # its `run_id` is a staff run's, never a schedule's
    "hub.refresh_watches": ("limit",),
    "hub.sync_stalest": ("limit",),
    "registry.flush_outbox": ("limit",),
    "workers.dispatch_template_changes": ("limit",),
    "workers.prune_heartbeats": ("days",),
    "workers.request_due_probes": ("limit",),
    "workers.request_missing_checks": ("limit",),
}
SCHEDULABLE_TASKS: tuple[str, ...] = tuple(sorted(TASK_KWARGS))


def kwargs_errors(task: str, kwargs: dict[str, Any]) -> list[str]:
    """Why these keyword arguments cannot be sent to `task` (empty: they can). That they are
    an object at all is the model's to say (`PeriodicJob.clean`)."""
    known = TASK_KWARGS.get(task)
    if known is None:
        return []  # a task copied from an older schedule: the worker says what it takes
    errors = []
    for key, value in kwargs.items():
        if key not in known:
            takes = ", ".join(known) if known else "none"
            errors.append(f"{task} takes no argument {key!r} (it takes: {takes}).")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(f"{key} must be a whole number of 1 or more, not {value!r}.")
    return errors


def ensure_default_schedule() -> int:
    """Create the missing default jobs; existing rows (maybe edited in the admin) are kept,
    except that a row still at an earlier default interval moves to the current one."""
    from django.utils import timezone

    from .models import PeriodicJob

    created = 0
    for job in DEFAULT_SCHEDULE:
        row, was_created = PeriodicJob.objects.get_or_create(
            name=job.name,
            defaults={"task": job.task, "every_seconds": job.every_seconds, "kwargs": job.kwargs},
        )
        created += was_created
        if not was_created and job.earlier_defaults:
            PeriodicJob.objects.filter(pk=row.pk, every_seconds__in=job.earlier_defaults).update(
                every_seconds=job.every_seconds, edited_at=timezone.now()
            )
    return created


@receiver(post_migrate)
def _schedule_after_migrate(sender: Any, **kwargs: Any) -> None:
    if getattr(sender, "name", "") == "workers":
        ensure_default_schedule()
