"""Probe runs as the queue and the reports leave them: what a probe that measured nothing,
a report the database refused once, a probe whose worker died and two requests at once
record."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError, connections, transaction
from django.test import Client
from django.utils import timezone

from registry import probes as probing
from registry.models import EventKind, ModelEvent, ProbeRun, ProbeState
from tests.pipeline_data import SAFE_TEMPLATE, add_model


def _report(*verdicts: str) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "status": "ok",
        "machine": {"chip": "test"},
        "results": [{"verdict": v, "reused_share": 1.0, "disagreement": False} for v in verdicts],
    }


@pytest.mark.django_db
def test_a_probe_that_measured_nothing_is_not_a_verdict_change(client: Client) -> None:
    """The probe's own report when every conversation errored, or the job deadline was reached
    before the first one: status "ok", every result with an error and no verdict."""
    model = add_model("org/nothing-measured", SAFE_TEMPLATE)
    first = probing.request_probe(model, model_dir="/x")
    probing.store_report(first.pk, _report("hit"))
    second = probing.request_probe(model, model_dir="/x")
    nothing = {
        **_report(),
        "results": [
            {
                "conversation": "weather",
                "prompt_size": 1024,
                "path": "library",
                "verdict": None,
                "reused_share": None,
                "disagreement": False,
                "error": "skipped: job deadline of 2880 s reached",
            },
        ],
    }
    stored = probing.store_report(second.pk, nothing)
    assert stored is not None and stored.state == ProbeState.ERROR
    assert stored.report is not None
    assert str(stored.report["error"]).startswith("the probe measured nothing: skipped")
    events = ModelEvent.objects.filter(kind=EventKind.PROBE_CHANGED)
    section = client.get(f"/m/{model.repo_id}/").content.decode().split('id="probe-h"')[1]
    section = section.split("</section>")[0]
    # Before: an event "mlx-lm probe hit → " (no verdict), and on the page "No result" beside
    # "Agrees with the template check".
    assert [(e.data["old"], e.data["new"]) for e in events] == []
    assert "Agrees with the template check" not in section


@pytest.mark.django_db
def test_store_probe_report_is_retried_after_a_database_error() -> None:
    from registry import tasks

    model = add_model("org/db-blip", SAFE_TEMPLATE)
    run = probing.request_probe(model, model_dir="/x")
    real = probing.store_report
    calls = {"n": 0}

    def flaky(run_id: int, report: dict[str, Any]) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real(run_id, report)

    with mock.patch.object(tasks, "store_report", flaky):
        result = tasks.store_probe_report.apply(args=(run.pk, _report("hit")))
    run.refresh_from_db()
    # Before: one call, and the hour-long probe's report lost (max_retries declared, unused).
    assert calls["n"] == 2, result.state
    assert run.state == ProbeState.DONE


@pytest.mark.django_db
def test_probes_stuck_running_do_not_block_the_queue_for_ever() -> None:
    """The Mac died, or its hard time limit killed the task: no report will ever come."""
    long_ago = timezone.now() - timedelta(days=3)
    for n in range(probing.MAX_WAITING):
        m = add_model(f"org/stuck-{n}", SAFE_TEMPLATE)
        ProbeRun.objects.create(
            model=m,
            commit_sha=m.last_commit_sha,
            state=ProbeState.RUNNING,
            queued_at=long_ago,
            started_at=long_ago,
            worker="mac@gone",
        )
    add_model("org/due", SAFE_TEMPLATE, downloads=10)
    # Before, nothing was ever probed again: three places held for ever.
    assert probing.request_due_probes() == 1
    stuck = ProbeRun.objects.filter(model__repo_id__startswith="org/stuck-")
    assert set(stuck.values_list("state", flat=True)) == {ProbeState.ERROR}
    assert ProbeRun.objects.waiting().get().model.repo_id == "org/due"


@pytest.mark.django_db(transaction=True)
def test_staff_probe_and_the_beat_do_not_queue_two_probes_of_one_model() -> None:
    model = add_model("org/raced", SAFE_TEMPLATE, downloads=5)
    created, release = threading.Event(), threading.Event()

    def staff_clicks() -> None:
        try:
            with transaction.atomic():  # the view's request, still open when the beat runs
                probing.request_probe_once(model)
                created.set()
                release.wait(10)
        finally:
            connections.close_all()

    def beat_runs() -> None:
        try:
            probing.request_due_probes()
        finally:
            connections.close_all()

    with mock.patch.object(probing, "enqueue_on_commit"):
        staff = threading.Thread(target=staff_clicks)
        staff.start()
        assert created.wait(10)
        beat = threading.Thread(target=beat_runs)
        beat.start()
        beat.join(2)  # with the model's row locked, the beat waits for the staff's commit
        release.set()
        staff.join(10)
        beat.join(10)
    assert ProbeRun.objects.waiting().filter(model=model).count() == 1


@pytest.mark.django_db
def test_a_late_report_of_an_expired_probe_is_still_stored() -> None:
    long_ago = timezone.now() - timedelta(days=3)
    m = add_model("org/late", SAFE_TEMPLATE)
    run = ProbeRun.objects.create(
        model=m,
        commit_sha=m.last_commit_sha,
        state=ProbeState.RUNNING,
        queued_at=long_ago,
        started_at=long_ago,
    )
    probing.request_due_probes()
    run.refresh_from_db()
    assert run.state == ProbeState.ERROR
    assert probing.store_report(run.pk, _report("hit")).state == ProbeState.DONE  # type: ignore[union-attr]
