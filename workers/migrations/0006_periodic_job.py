"""Beat's schedule moves from django-celery-beat's tables to `PeriodicJob` (workers/beat.py says
why). An installation that had them keeps what its staff edited: each job with an interval is
copied (its interval in seconds, keyword arguments, on or off, when it last ran); a job the new
table cannot hold (a crontab, solar or clocked schedule, a one-off or expiring job, positional
arguments, an interval past 68 years) is named in the log and left out. The old tables stay as
they were: nothing is dropped."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import django.core.validators
from django.db import migrations, models

logger = logging.getLogger(__name__)

#: django-celery-beat's interval periods, in seconds.
PERIOD_SECONDS = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
OLD_TASKS = "django_celery_beat_periodictask"
OLD_INTERVALS = "django_celery_beat_intervalschedule"
#: The most seconds the column holds (PostgreSQL's integer).
MOST_SECONDS = 2**31 - 1


def _aware(moment: datetime | None) -> datetime | None:
    """A time as stored: SQLite gives it back naive (in UTC, as Django writes it)."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def copy_old_schedule(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    tables = set(connection.introspection.table_names())
    if OLD_TASKS not in tables or OLD_INTERVALS not in tables:
        return
    PeriodicJob = apps.get_model("workers", "PeriodicJob")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.name, t.task, t.args, t.kwargs, t.enabled, t.last_run_at,"
            f" t.total_run_count, i.every, i.period, t.one_off, t.expires"
            f" FROM {OLD_TASKS} t LEFT JOIN {OLD_INTERVALS} i ON i.id = t.interval_id"
        )
        rows = cursor.fetchall()
    for name, task, args, kwargs, enabled, last_run_at, runs, every, period, once, ends in rows:
        try:
            kwargs = json.loads(kwargs or "{}")
            args = json.loads(args or "[]")
        except ValueError:
            kwargs, args = None, None
        known = every is not None and period in PERIOD_SECONDS
        seconds = int(every) * PERIOD_SECONDS[period] if known else 0
        if (
            every is None
            or not 1 <= seconds <= MOST_SECONDS
            or args
            or not isinstance(kwargs, dict)
            or once
            or ends is not None
        ):
            logger.warning(
                "beat's job %r (%s) was not carried over: only a recurring interval and"
                " keyword arguments can be; add it again in the admin",
                name,
                task,
            )
            continue
        PeriodicJob.objects.update_or_create(
            name=name,
            defaults={
                "task": task,
                "every_seconds": seconds,
                "kwargs": kwargs,
                "enabled": bool(enabled),
                "last_run_at": _aware(last_run_at),
                "total_run_count": max(0, int(runs or 0)),
            },
        )


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0005_hand_over_domain_tables"),
    ]

    operations = [
        migrations.CreateModel(
            name="PeriodicJob",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                (
                    "task",
                    models.CharField(
                        help_text="The task's name, as the workers know it.", max_length=200
                    ),
                ),
                (
                    "every_seconds",
                    models.PositiveIntegerField(
                        validators=[django.core.validators.MinValueValidator(1)],
                        verbose_name="every (seconds)",
                    ),
                ),
                (
                    "kwargs",
                    models.JSONField(
                        blank=True, default=dict, help_text="Keyword arguments, a JSON object."
                    ),
                ),
                ("enabled", models.BooleanField(default=True)),
                ("last_run_at", models.DateTimeField(blank=True, editable=False, null=True)),
                ("total_run_count", models.PositiveIntegerField(default=0, editable=False)),
                ("edited_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "ordering": ["name"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(every_seconds__gte=1),
                        name="periodicjob_every_second_or_more",
                    )
                ],
            },
        ),
        migrations.RunPython(copy_old_schedule, migrations.RunPython.noop),
    ]
