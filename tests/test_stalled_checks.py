"""The sweeper re-sends a check whose worker died at once, not after the lease or 4 minutes."""

from __future__ import annotations

import os
import socket
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from checks import ENGINE_VERSION
from registry import pipeline
from registry.models import CheckRun, CheckStatus, Lease, TemplateVersion
from tests.pipeline_data import SAFE_TEMPLATE

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Capture what the sweeper re-sends instead of sending it to a broker."""
    calls: list[int] = []
    monkeypatch.setattr(pipeline, "send_check", calls.append)
    return calls


def running_check(*, started_ago: timedelta) -> CheckRun:
    """A run a worker has claimed and marked running, `started_ago`."""
    version, _ = TemplateVersion.objects.get_or_create_for_text(SAFE_TEMPLATE)
    return CheckRun.objects.create(
        template_version=version,
        engine_version=ENGINE_VERSION,
        status=CheckStatus.RUNNING,
        started_at=timezone.now() - started_ago,
    )


def hold(run: CheckRun, pid: int, *, host: str = "", expires_in: timedelta | None = None) -> None:
    """The lease the check task holds while it runs, as `registry.jobs.acquire` writes it."""
    Lease.objects.create(
        key=f"check:{run.pk}",
        holder=f"{host or socket.gethostname()}:{pid}",
        expires_at=timezone.now() + (expires_in or timedelta(minutes=3)),
    )


def exited_pid() -> int:
    """The pid of a process that has exited (as a SIGKILLed worker's pool process has)."""
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    return gone.pid


def test_a_check_held_by_a_dead_worker_is_sent_again_on_the_next_sweep(sent: list[int]) -> None:
    run = running_check(started_ago=timedelta(seconds=5))
    hold(run, exited_pid())
    assert pipeline.resend_stalled_checks() == 1
    assert sent == [run.pk]


def test_a_check_held_by_a_live_worker_is_left_alone(sent: list[int]) -> None:
    run = running_check(started_ago=timedelta(minutes=3))
    hold(run, os.getpid())
    assert pipeline.resend_stalled_checks() == 0
    assert sent == []


@pytest.mark.parametrize("lease", ["gone", "expired"])
def test_a_running_check_without_a_live_lease_is_sent_again_after_half_a_minute(
    sent: list[int], lease: str
) -> None:
    run = running_check(started_ago=timedelta(seconds=5))
    if lease == "expired":
        # Held on another host, so only the expiry says the holder is gone.
        hold(run, 1, host="elsewhere", expires_in=timedelta(seconds=-1))
    assert pipeline.resend_stalled_checks() == 0  # just started: maybe between two deliveries
    CheckRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(seconds=40))
    assert pipeline.resend_stalled_checks() == 1
    assert sent == [run.pk]


def test_a_live_worker_past_the_long_limit_and_an_old_pending_run_are_still_sent(
    sent: list[int],
) -> None:
    slow = running_check(started_ago=timedelta(minutes=5))
    hold(slow, os.getpid())
    version, _ = TemplateVersion.objects.get_or_create_for_text(SAFE_TEMPLATE + " ")
    lost = CheckRun.objects.create(
        template_version=version,
        engine_version=ENGINE_VERSION,
        created_at=timezone.now() - 2 * pipeline.RESEND_PENDING_AFTER,
    )
    assert pipeline.resend_stalled_checks() == 2
    assert sorted(sent) == sorted([slow.pk, lost.pk])


def test_the_sweep_runs_often_enough_to_resend_within_a_minute() -> None:
    """An unedited schedule row from before moves to the new default; an edited one stays."""
    from workers.models import PeriodicJob
    from workers.schedule import ensure_default_schedule

    ensure_default_schedule()
    row = PeriodicJob.objects.get(task="workers.request_missing_checks")
    PeriodicJob.objects.filter(pk=row.pk).update(every_seconds=120)
    ensure_default_schedule()
    assert PeriodicJob.objects.get(pk=row.pk).every_seconds == 30
    PeriodicJob.objects.filter(pk=row.pk).update(every_seconds=45)
    ensure_default_schedule()
    assert PeriodicJob.objects.get(pk=row.pk).every_seconds == 45
