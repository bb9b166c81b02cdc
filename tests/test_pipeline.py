"""The check pipeline with a real Celery worker: each change checked once, nothing lost."""

from __future__ import annotations

import os
import signal
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from registry import jobs, pipeline
from registry.models import (
    CheckRun,
    CheckStatus,
    EventKind,
    HubModel,
    Lease,
    ModelEvent,
    OutboxMessage,
    TemplateChange,
    Verdict,
)
from registry.tasks import dispatch_template_changes, run_check
from tests.pipeline_data import SAFE_TEMPLATE, SLOW_PREFIX, UNSAFE_TEMPLATE, add_model
from tests.tcpproxy import TcpProxy
from tests.workerproc import wait_for
from workers.celery import app

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def all_checked() -> bool:
    return not HubModel.objects.filter(verdict=Verdict.PENDING).exists()


def engine_runs(log: str, run_id: int) -> int:
    return log.count(f"check {run_id}: running the engine")


def test_shared_templates_are_checked_once_and_every_model_gets_its_verdict(
    celery_workers: Any,
) -> None:
    for i in range(12):
        add_model(f"org{i % 3}/safe-{i}", SAFE_TEMPLATE)
        add_model(f"org{i % 3}/unsafe-{i}", UNSAFE_TEMPLATE)
    celery_workers(concurrency=2)

    dispatch_template_changes.delay()
    wait_for(all_checked, 90, "every model to get a verdict")
    wait_for(
        lambda: not TemplateChange.objects.filter(checks_claimed_at=None).exists(),
        30,
        "every change to be dispatched",
    )

    assert CheckRun.objects.count() == 2
    assert set(
        HubModel.objects.filter(repo_id__contains="/safe-").values_list("verdict", flat=True)
    ) == {Verdict.SAFE}
    unsafe = HubModel.objects.filter(repo_id__contains="/unsafe-")
    assert set(unsafe.values_list("verdict", flat=True)) == {Verdict.UNSAFE}
    assert all(m.verdict_summary for m in unsafe)
    assert ModelEvent.objects.filter(kind=EventKind.TEMPLATE_CHANGED).count() == 24


def test_two_beat_ticks_and_a_duplicate_delivery_do_the_work_once(celery_workers: Any) -> None:
    model = add_model("org/dup", SAFE_TEMPLATE.replace("helpful", "dup"))
    # Two dispatchers racing in this process and the worker, like two beat ticks at once.
    threads = [threading.Thread(target=pipeline.dispatch_template_changes) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worker = celery_workers(concurrency=2)
    run = CheckRun.objects.get()
    run_check.delay(run.pk)  # delivered twice on top of the dispatcher's own send
    run_check.delay(run.pk)

    wait_for(lambda: CheckRun.objects.get(pk=run.pk).status == CheckStatus.DONE, 60, "the check")
    wait_for(lambda: worker.log().count("done already") >= 1, 30, "the duplicates to finish")
    assert engine_runs(worker.log(), run.pk) == 1
    event = ModelEvent.objects.get(model=model, kind=EventKind.TEMPLATE_CHANGED)
    assert event.summary.startswith(f"{model.repo_id}: chat template added (")  # its first
    assert CheckRun.objects.count() == 1


def test_worker_process_killed_mid_check_is_rerun_without_duplicates(celery_workers: Any) -> None:
    model = add_model("org/slow", SLOW_PREFIX + SAFE_TEMPLATE)
    worker = celery_workers(concurrency=1)
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()

    # Mid-check: the engine has started (logged after the lease is taken, so waiting for the
    # lease alone could kill the process before the first run counts).
    wait_for(lambda: engine_runs(worker.log(), run.pk) == 1, 60, "the check to start")
    lease = Lease.objects.get(key=f"check:{run.pk}")
    os.kill(int(lease.holder.rsplit(":", 1)[1]), signal.SIGKILL)  # the pool process, mid-check

    wait_for(lambda: CheckRun.objects.get(pk=run.pk).status == CheckStatus.DONE, 90, "a rerun")
    assert engine_runs(worker.log(), run.pk) == 2
    assert CheckRun.objects.count() == 1
    model.refresh_from_db()
    assert model.verdict == Verdict.SAFE
    # The rerun releases the lease it took over after it stored the result (`run_check`'s
    # `finally`): a moment after DONE is visible, not in the same transaction.
    wait_for(lambda: not Lease.objects.exists(), 10, "the rerun to release its lease")


@pytest.mark.skipif(not settings.REDIS_URL, reason="redelivery after a crash is Redis's")
def test_whole_worker_killed_mid_check_resumes_on_another_worker(celery_workers: Any) -> None:
    add_model("org/crash", SLOW_PREFIX + SAFE_TEMPLATE.replace("helpful", "crash"))
    fast_redelivery = {"CELERY_VISIBILITY_TIMEOUT": "3"}
    first = celery_workers(extra_env=fast_redelivery)
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()
    wait_for(lambda: Lease.objects.filter(key=f"check:{run.pk}").exists(), 60, "the check")
    first.kill_everything()
    assert CheckRun.objects.get(pk=run.pk).status == CheckStatus.RUNNING

    second = celery_workers(extra_env=fast_redelivery)
    wait_for(lambda: CheckRun.objects.get(pk=run.pk).status == CheckStatus.DONE, 120, "redelivery")
    assert engine_runs(second.log(), run.pk) == 1
    assert CheckRun.objects.count() == 1


def test_a_template_past_its_limits_ends_as_error_and_the_worker_goes_on(
    celery_workers: Any,
) -> None:
    hostile = add_model("org/hostile", "{% for i in range(99999) %}{% for j in range(99999) %}"
                        "{% endfor %}{% endfor %}")  # fmt: skip
    good = add_model("org/good", SAFE_TEMPLATE.replace("helpful", "good"))
    celery_workers(extra_env={"CHECK_CPU_SECONDS": "2"})
    dispatch_template_changes.delay()
    wait_for(all_checked, 90, "both verdicts")
    hostile.refresh_from_db()
    good.refresh_from_db()
    assert hostile.verdict == Verdict.ERROR
    run = CheckRun.objects.get(template_version=hostile.current_snapshot.default_template)  # type: ignore[union-attr]
    assert "2 s" in run.error or "exceeded" in run.error, run.error
    assert good.verdict == Verdict.SAFE


@pytest.mark.skipif(not settings.REDIS_URL, reason="cuts the Redis broker")
def test_worker_survives_a_broker_outage_and_finishes_the_queued_work(celery_workers: Any) -> None:
    proxy = TcpProxy("127.0.0.1", int(settings.REDIS_URL.split(":")[2].split("/")[0])).start()
    db = settings.REDIS_URL.rsplit("/", 1)[1]
    worker = celery_workers(extra_env={"REDIS_URL": f"redis://127.0.0.1:{proxy.port}/{db}"})
    proxy.stop()  # the broker is gone for the worker
    model = add_model("org/outage", SAFE_TEMPLATE.replace("helpful", "outage"))
    dispatch_template_changes.delay()  # queued while the worker cannot reach the broker
    proxy.port, restarted = proxy.port, proxy.start()
    assert restarted.port == proxy.port
    wait_for(lambda: HubModel.objects.get(pk=model.pk).verdict != Verdict.PENDING, 120, "resume")
    assert "Connection to broker lost" in worker.log() or "Cannot connect" in worker.log()


def test_an_enqueue_lost_to_a_broker_outage_is_sent_when_the_broker_is_back(
    celery_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kombu.exceptions import OperationalError

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to broker: Connection refused")

    model = add_model("org/lost", SAFE_TEMPLATE.replace("helpful", "lost"))
    with monkeypatch.context() as patch:
        patch.setattr(run_check, "apply_async", broker_down)
        pipeline.dispatch_template_changes()  # must not raise; the run stays pending in Postgres
    run = CheckRun.objects.get()
    assert run.status == CheckStatus.PENDING
    [kept] = OutboxMessage.objects.all()
    assert (kept.task, kept.args) == ("workers.run_check", [run.pk])

    celery_workers()
    # The outbox's beat job, once the broker is back (rows younger than 10 s are left alone).
    OutboxMessage.objects.update(created_at=kept.created_at - timedelta(minutes=1))
    assert jobs.flush_outbox(app.send_task) == 1
    wait_for(lambda: HubModel.objects.get(pk=model.pk).verdict == Verdict.SAFE, 60, "the resend")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="cuts PostgreSQL connections")
def test_database_connection_lost_during_a_check_is_retried_and_nothing_half_written(
    celery_workers: Any,
) -> None:
    model = add_model("org/dbblip", SLOW_PREFIX + SAFE_TEMPLATE.replace("helpful", "blip"))
    worker = celery_workers()
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()
    wait_for(lambda: Lease.objects.filter(key=f"check:{run.pk}").exists(), 60, "the check")
    with connection.cursor() as cursor:  # the database drops every worker connection
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    wait_for(lambda: CheckRun.objects.get(pk=run.pk).status == CheckStatus.DONE, 90, "the retry")
    assert "Retry in" in worker.log()
    model.refresh_from_db()
    assert model.verdict == Verdict.SAFE
    assert CheckRun.objects.count() == 1
