"""Beat's schedule is the `PeriodicJob` table: what is on runs, an edit is read within seconds,
when a job last ran survives a restart, and an old django-celery-beat schedule is carried over."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from tests.conftest import REPO_ROOT
from tests.workerproc import database_url_for_children, wait_for
from workers import beat
from workers.beat import TableScheduler
from workers.celery import app
from workers.models import PeriodicJob, WorkerHeartbeat

pytestmark = pytest.mark.django_db


class RecordingScheduler(TableScheduler):
    """The table scheduler with Celery's timing, but the sends recorded instead of published."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        super().__init__(*args, **kwargs)

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **_: Any) -> None:
        if advance:
            entry = self.reserve(entry)
        self.sent.append((entry.name, entry.task, dict(entry.kwargs)))


def only(*jobs: dict[str, Any]) -> None:
    PeriodicJob.objects.all().delete()
    for job in jobs:
        PeriodicJob.objects.create(**job)


def run_ticks(scheduler: RecordingScheduler, n: int = 5) -> None:
    for _ in range(n):
        scheduler.tick()


def test_enabled_jobs_are_the_schedule_and_a_due_one_is_sent_with_its_arguments() -> None:
    long_ago = timezone.now() - timedelta(hours=2)
    only(
        {"name": "due", "task": "hub.sync_stalest", "every_seconds": 600,
         "kwargs": {"limit": 7}, "last_run_at": long_ago},
        {"name": "off", "task": "hub.discover", "every_seconds": 1, "enabled": False},
        {"name": "not yet", "task": "workers.prune_heartbeats", "every_seconds": 86400},
    )  # fmt: skip
    scheduler = RecordingScheduler(app=app)
    assert set(scheduler.schedule) == {"due", "not yet"}
    run_ticks(scheduler)
    # "not yet" was never run: it is due one interval after it was written, not at once.
    assert scheduler.sent == [("due", "hub.sync_stalest", {"limit": 7})]


def test_when_a_job_ran_is_written_back_so_a_restarted_beat_does_not_run_it_again() -> None:
    only({"name": "due", "task": "hub.sync_stalest", "every_seconds": 600,
          "last_run_at": timezone.now() - timedelta(hours=2), "total_run_count": 4})  # fmt: skip
    first = RecordingScheduler(app=app)
    run_ticks(first)
    assert len(first.sent) == 1
    first.close()  # beat stopping: syncs
    row = PeriodicJob.objects.get(name="due")
    assert row.total_run_count == 5
    assert row.last_run_at is not None and timezone.now() - row.last_run_at < timedelta(minutes=1)

    restarted = RecordingScheduler(app=app)
    run_ticks(restarted)
    assert restarted.sent == []


def test_an_edit_in_the_admin_is_read_within_the_reload_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    only({"name": "job", "task": "hub.sync_stalest", "every_seconds": 3600})
    scheduler = RecordingScheduler(app=app)
    run_ticks(scheduler)
    assert scheduler.sent == []

    job = PeriodicJob.objects.get(name="job")
    job.every_seconds = 1
    job.last_run_at = None
    job.save()  # as the admin saves: `edited_at` moves
    PeriodicJob.objects.filter(pk=job.pk).update(last_run_at=timezone.now() - timedelta(hours=1))
    run_ticks(scheduler)
    assert scheduler.sent == [], "read before the reload interval"

    monkeypatch.setattr(beat, "RELOAD_CHECK_SECONDS", 0.0)
    run_ticks(scheduler)
    assert [name for name, _, _ in scheduler.sent] == ["job"]

    PeriodicJob.objects.filter(pk=job.pk).update(enabled=False, edited_at=timezone.now())
    sent = len(scheduler.sent)
    run_ticks(scheduler)
    assert "job" not in scheduler.schedule
    assert len(scheduler.sent) == sent


def test_a_database_outage_keeps_the_last_schedule(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    only({"name": "job", "task": "hub.sync_stalest", "every_seconds": 600})
    scheduler = RecordingScheduler(app=app)
    monkeypatch.setattr(beat, "RELOAD_CHECK_SECONDS", 0.0)

    def down(self: Any) -> Any:
        raise DatabaseError("server closed the connection unexpectedly")

    monkeypatch.setattr(type(PeriodicJob.objects.all()), "version", down)
    run_ticks(scheduler)
    assert set(scheduler.schedule) == {"job"}
    assert "could not read the schedule, keeping the last one: server closed" in caplog.text


def test_the_admin_edits_the_schedule(admin_client: Any) -> None:
    only({"name": "job", "task": "hub.sync_stalest", "every_seconds": 600, "kwargs": {"limit": 1}})
    job = PeriodicJob.objects.get(name="job")
    before = job.edited_at
    page = admin_client.get(f"/admin/workers/periodicjob/{job.pk}/change/")
    assert page.status_code == 200
    assert b"hub.sync_stalest" in page.content and b"workers.request_missing_checks" in page.content

    form = {"name": "job", "task": "hub.sync_stalest", "every_seconds": "60",
            "kwargs": '{"limit": 50}', "enabled": "on"}  # fmt: skip
    saved = admin_client.post(f"/admin/workers/periodicjob/{job.pk}/change/", form)
    assert saved.status_code == 302
    job.refresh_from_db()
    assert (job.every_seconds, job.kwargs) == (60, {"limit": 50})
    assert job.edited_at > before

    for bad in (
        {"kwargs": "[1, 2]"},
        {"every_seconds": "0"},
        {"task": "os.system"},
        {"kwargs": '{"limt": 5}'},  # a task that would refuse it at every run
        {"kwargs": '{"limit": "50"}'},
        {"kwargs": '{"limit": 0}'},
    ):
        refused = admin_client.post(f"/admin/workers/periodicjob/{job.pk}/change/", form | bad)
        assert refused.status_code == 200, bad  # the form again, with its error
        assert b"errorlist" in refused.content, bad
    job.refresh_from_db()
    assert (job.every_seconds, job.kwargs, job.task) == (60, {"limit": 50}, "hub.sync_stalest")
    refused = admin_client.post(
        f"/admin/workers/periodicjob/{job.pk}/change/", form | {"kwargs": '{"limt": 5}'}
    )
    assert "hub.sync_stalest takes no argument &#x27;limt&#x27; (it takes: limit)." in (
        refused.content.decode()
    )

    # The name is not edited (a default job is found by it after every migrate), and a save
    # leaves alone when the job last ran, which beat may have written meanwhile.
    form_page = admin_client.get(f"/admin/workers/periodicjob/{job.pk}/change/").content
    assert b'name="name"' not in form_page
    from django.db.models.signals import pre_save

    ran = timezone.now() - timedelta(seconds=5)

    def beat_syncs_meanwhile(sender: Any, **_: Any) -> None:
        # After the admin read the row, before it writes it: beat records a run.
        PeriodicJob.objects.filter(pk=job.pk).update(last_run_at=ran, total_run_count=9)

    pre_save.connect(beat_syncs_meanwhile, sender=PeriodicJob)
    try:
        resaved = admin_client.post(
            f"/admin/workers/periodicjob/{job.pk}/change/", form | {"every_seconds": "90"}
        )
    finally:
        pre_save.disconnect(beat_syncs_meanwhile, sender=PeriodicJob)
    assert resaved.status_code == 302
    job.refresh_from_db()
    assert (job.every_seconds, job.last_run_at, job.total_run_count) == (90, ran, 9)
    assert job.name == "job"

    turned_off = admin_client.post(
        "/admin/workers/periodicjob/", {"action": "turn_off", "_selected_action": [job.pk]}
    )
    assert turned_off.status_code == 302
    job.refresh_from_db()
    assert not job.enabled and job.edited_at > before


OLD_TABLES = """
CREATE TABLE django_celery_beat_intervalschedule (
    id integer PRIMARY KEY, every integer NOT NULL, period varchar(24) NOT NULL);
CREATE TABLE django_celery_beat_periodictask (
    id integer PRIMARY KEY, name varchar(200) NOT NULL, task varchar(200) NOT NULL,
    args text NOT NULL, kwargs text NOT NULL, enabled boolean NOT NULL,
    last_run_at timestamp with time zone NULL, total_run_count integer NOT NULL,
    interval_id integer NULL, one_off boolean NOT NULL DEFAULT false,
    expires timestamp with time zone NULL);
"""


def test_an_old_django_celery_beat_schedule_is_carried_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the old tables are written here in PostgreSQL's SQL")
    migration = importlib.import_module("workers.migrations.0006_periodic_job")
    ran = timezone.now() - timedelta(minutes=3)
    with connection.cursor() as cursor:
        cursor.execute(OLD_TABLES)
        cursor.execute(
            "INSERT INTO django_celery_beat_intervalschedule VALUES"
            " (1, 30, 'seconds'), (2, 2, 'hours'), (3, 5, 'microseconds'),"
            " (4, 100000, 'days')"
        )
        cursor.execute(
            "INSERT INTO django_celery_beat_periodictask VALUES"
            " (1, 'Sync the stalest Hub repos', 'hub.sync_stalest', '[]', '{\"limit\": 20}',"
            "  true, %s, 12, 2),"
            " (2, 'Mine', 'hub.discover', '[]', '{}', false, NULL, 0, 1),"
            " (3, 'Cron', 'celery.backend_cleanup', '[]', '{}', true, NULL, 0, NULL),"
            " (4, 'Args', 'hub.discover', '[1]', '{}', true, NULL, 0, 1),"
            " (5, 'Tiny', 'hub.discover', '[]', '{}', true, NULL, 0, 3),"
            " (6, 'Huge', 'hub.discover', '[]', '{}', true, NULL, 0, 4)",
            [ran],
        )
        cursor.execute(
            "INSERT INTO django_celery_beat_periodictask"
            " (id, name, task, args, kwargs, enabled, total_run_count, interval_id, one_off,"
            "  expires) VALUES"
            " (7, 'Once', 'hub.discover', '[]', '{}', true, 0, 1, true, NULL),"
            " (8, 'Ended', 'hub.discover', '[]', '{}', true, 0, 1, false, now())"
        )
    from django.apps import apps
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    migration.copy_old_schedule(apps, BaseDatabaseSchemaEditor(connection))
    edited = PeriodicJob.objects.get(name="Sync the stalest Hub repos")
    assert (edited.every_seconds, edited.kwargs, edited.enabled) == (7200, {"limit": 20}, True)
    assert (edited.last_run_at, edited.total_run_count) == (ran, 12)
    mine = PeriodicJob.objects.get(name="Mine")
    assert (mine.task, mine.every_seconds, mine.enabled) == ("hub.discover", 30, False)
    left_out = ("Cron", "Args", "Tiny", "Huge", "Once", "Ended")
    assert not PeriodicJob.objects.filter(name__in=left_out).exists()
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert all(f"'{name}'" in logged for name in left_out)


@pytest.mark.django_db(transaction=True)
def test_a_real_beat_sends_the_tables_jobs_to_a_real_worker_and_stops_when_turned_off(
    celery_workers: Any, tmp_path: Path
) -> None:
    """`celery beat` as deployed, on the test database and broker: a job edited to run every
    second is sent, a worker runs it (it forgets a stale heartbeat), beat writes back when it
    ran; turned off, it is sent no more."""
    celery_workers(queues="default")
    only({"name": "Forget silent workers", "task": "workers.prune_heartbeats",
          "every_seconds": 1, "kwargs": {"days": 1},
          "last_run_at": timezone.now() - timedelta(hours=1)})  # fmt: skip

    def stale(name: str) -> None:
        WorkerHeartbeat.beat(name, ["default"], {})
        WorkerHeartbeat.objects.filter(hostname=name).update(
            last_seen=timezone.now() - timedelta(days=3)
        )

    stale("gone@1")
    log = (tmp_path / "beat.log").open("ab")
    env = {**os.environ, "DATABASE_URL": database_url_for_children(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "beat", "--loglevel", "INFO",
         "--schedule", str(tmp_path / "unused-schedule")],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: not WorkerHeartbeat.objects.filter(hostname="gone@1").exists(),
            60,
            "the scheduled job to forget the stale worker",
        )
        wait_for(
            lambda: PeriodicJob.objects.get().total_run_count > 0,
            30,
            "beat to write back when the job ran",
        )
        PeriodicJob.objects.update(enabled=False, edited_at=timezone.now())
        wait_for(
            lambda: "beat: 0 scheduled jobs" in (tmp_path / "beat.log").read_text(),
            30,
            "beat to read the edit",
        )
        stale("gone@2")
        time.sleep(4)  # four of the job's former intervals
        assert WorkerHeartbeat.objects.filter(hostname="gone@2").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()
    assert proc.returncode == 0, (tmp_path / "beat.log").read_text()


def test_the_arguments_the_admin_allows_are_the_tasks_own() -> None:
    """The admin's list of each task's keyword arguments matches the task's signature, and
    every default job is one of them with arguments it takes."""
    import inspect

    from registry.jobs import task_named
    from workers.schedule import DEFAULT_SCHEDULE, TASK_KWARGS, kwargs_errors

    for name, allowed in TASK_KWARGS.items():
        parameters = inspect.signature(task_named(name).run).parameters
        assert set(allowed) <= set(parameters), name
        for key in allowed:
            assert parameters[key].annotation in (int, "int"), (name, key)
    for job in DEFAULT_SCHEDULE:
        assert job.task in TASK_KWARGS and kwargs_errors(job.task, job.kwargs) == [], job.name


def test_beat_wakes_when_the_next_look_at_the_table_is_due() -> None:
    """Beat sleeps what a tick returns: never past the next look at the table, so an edit is
    read within RELOAD_CHECK_SECONDS, not up to twice that."""
    only({"name": "daily", "task": "workers.prune_heartbeats", "every_seconds": 86400})
    scheduler = RecordingScheduler(app=app)
    scheduler._last_checked = time.monotonic() - 4.0  # looked 4 s ago: due in 1
    assert scheduler.tick() <= 1.0
    scheduler._last_checked = time.monotonic() - 4.5
    assert scheduler.tick() <= 0.5
