"""Beat's schedule moves from django-celery-beat's tables to `PeriodicJob` (workers/beat.py says
why). An installation that had them keeps what its staff edited: each job with an interval is
copied (its interval in seconds, keyword arguments, on or off, when it last ran); a job the new
table cannot hold (a crontab, solar or one-time schedule, positional arguments) is named in the
log and left out. The old tables stay as they were: nothing is dropped."""

from __future__ import annotations

import json
import logging
from typing import Any

import django.core.validators
from django.db import migrations, models

logger = logging.getLogger(__name__)

#: django-celery-beat's interval periods, in seconds.
PERIOD_SECONDS = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
OLD_TASKS = "django_celery_beat_periodictask"
OLD_INTERVALS = "django_celery_beat_intervalschedule"


def copy_old_schedule(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    tables = set(connection.introspection.table_names())
    if OLD_TASKS not in tables or OLD_INTERVALS not in tables:
        return
    PeriodicJob = apps.get_model("workers", "PeriodicJob")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.name, t.task, t.args, t.kwargs, t.enabled, t.last_run_at,"
            f" t.total_run_count, i.every, i.period"
            f" FROM {OLD_TASKS} t LEFT JOIN {OLD_INTERVALS} i ON i.id = t.interval_id"
        )
        rows = cursor.fetchall()
    for name, task, args, kwargs, enabled, last_run_at, runs, every, period in rows:
        try:
            kwargs = json.loads(kwargs or "{}")
            args = json.loads(args or "[]")
        except ValueError:
            kwargs, args = None, None
        if every is None or period not in PERIOD_SECONDS or args or not isinstance(kwargs, dict):
            logger.warning(
                "beat's job %r (%s) was not carried over: only an interval and keyword"
                " arguments can be; add it again in the admin",
                name,
                task,
            )
            continue
        PeriodicJob.objects.update_or_create(
            name=name,
            defaults={
                "task": task,
                "every_seconds": max(1, int(every) * PERIOD_SECONDS[period]),
                "kwargs": kwargs,
                "enabled": bool(enabled),
                "last_run_at": last_run_at,
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
            options={"ordering": ["name"]},
        ),
        migrations.RunPython(copy_old_schedule, migrations.RunPython.noop),
    ]
