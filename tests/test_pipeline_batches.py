"""Pipeline steps one at a time (STYLE §10): engine upgrades re-check in bounded batches."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from checks import TemplateReport
from registry import pipeline
from registry.models import CheckRun, CheckStatus, EventKind, HubModel, Lease, ModelEvent, Verdict
from registry.tasks import CHECK_SECONDS
from tests.pipeline_data import SAFE_TEMPLATE, UNSAFE_TEMPLATE, add_model

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Capture what the pipeline enqueues instead of sending it to a broker."""
    calls: list[int] = []
    monkeypatch.setattr(pipeline, "send_check", calls.append)
    return calls


def finish(run: CheckRun, verdict: str) -> list[int]:
    """Store a report with this verdict, as the check task does with the engine's."""
    report = TemplateReport(
        file=run.template_version.sha256,
        origin="registry",
        sha256=run.template_version.sha256,
        engine_version=run.engine_version,
        verdict=verdict,
        summary=f"{verdict} summary",
        reason=None,
        template_names=("default",),
        kwargs_read=(),
        variants=(),
        failures=(),
        findings=(),
        seed_check=(),
    )
    return pipeline.store_result(run.pk, report.to_dict())


def test_a_new_engine_version_rechecks_versions_in_use_in_bounded_batches(
    sent: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        add_model(f"org/m{i}", SAFE_TEMPLATE.replace("helpful", f"helpful {i}"))
    assert pipeline.request_missing_checks(limit=10) == 3
    for run in CheckRun.objects.all():
        finish(run, Verdict.SAFE)
    assert pipeline.request_missing_checks(limit=10) == 0

    monkeypatch.setattr(pipeline, "ENGINE_VERSION", "next")
    sent.clear()
    assert pipeline.request_missing_checks(limit=2) == 2
    assert pipeline.request_missing_checks(limit=2) == 1
    assert pipeline.request_missing_checks(limit=2) == 0
    assert len(sent) == 3
    assert CheckRun.objects.filter(engine_version="next").count() == 3
    # Until the new engine answers, the catalog keeps showing the last verdict.
    assert set(HubModel.objects.values_list("verdict", flat=True)) == {Verdict.SAFE}


def test_a_verdict_flip_is_one_event_and_the_first_verdict_is_none(sent: list[int]) -> None:
    model = add_model("org/flip", SAFE_TEMPLATE)
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()
    assert finish(run, Verdict.SAFE) == []
    assert not ModelEvent.objects.filter(kind=EventKind.VERDICT_CHANGED).exists()

    other = add_model("org/other", UNSAFE_TEMPLATE)
    pipeline.dispatch_template_changes()
    # The upstream repo switches to the unsafe template: same model, new snapshot.
    HubModel.objects.filter(pk=model.pk).update(current_snapshot=other.current_snapshot)
    unsafe_run = CheckRun.objects.get(template_version=other.current_snapshot.default_template)  # type: ignore[union-attr]
    assert finish(unsafe_run, Verdict.UNSAFE) == [model.pk]
    assert finish(unsafe_run, Verdict.UNSAFE) == []  # a retried store changes nothing
    events = ModelEvent.objects.filter(kind=EventKind.VERDICT_CHANGED, model=model)
    assert [(e.data["old"], e.data["new"]) for e in events] == [("safe", "unsafe")]


def test_a_model_with_named_templates_waits_for_all_and_takes_the_worst(sent: list[Any]) -> None:
    from registry.models import NamedTemplate, TemplateVersion

    model = add_model("org/named", SAFE_TEMPLATE)
    tool_use, _ = TemplateVersion.objects.get_or_create_for_text(UNSAFE_TEMPLATE)
    assert model.current_snapshot is not None
    NamedTemplate.objects.create(snapshot=model.current_snapshot, name="tool_use", version=tool_use)
    assert pipeline.request_missing_checks() == 2
    default_run = CheckRun.objects.get(template_version=model.current_snapshot.default_template)
    finish(default_run, Verdict.SAFE)
    model.refresh_from_db()
    assert model.verdict == Verdict.PENDING
    finish(CheckRun.objects.get(template_version=tool_use), Verdict.UNSAFE)
    model.refresh_from_db()
    assert model.verdict == Verdict.UNSAFE
    # From "not checked" to a verdict is no flip: nobody is told the model "changed".
    assert not ModelEvent.objects.filter(kind=EventKind.VERDICT_CHANGED).exists()
    assert "“tool_use” template" in model.verdict_summary


@pytest.mark.parametrize(
    ("tool_use_verdict", "verdict", "worst"),
    [
        (Verdict.SAFE, Verdict.SAFE_WHERE_RENDERABLE, "rag"),
        (Verdict.UNSAFE, Verdict.UNSAFE, "tool_use"),
    ],
)
def test_a_model_whose_named_templates_have_no_default_needs_a_name(
    sent: list[Any], tool_use_verdict: str, verdict: str, worst: str
) -> None:
    """Named `rag` and `tool_use`, none `default` (the first by name stands in as the snapshot's
    template, as a sync files it): a caller who names none gets an error for requests without
    tools, so the model is at best safe where it renders, and its summary says a name is needed
    rather than speaking for `rag` as if it were the default."""
    from registry.models import NamedTemplate, TemplateVersion

    model = add_model("org/no-default", SAFE_TEMPLATE)
    assert model.current_snapshot is not None
    model.current_snapshot.named_templates.update(name="rag")
    tool_use, _ = TemplateVersion.objects.get_or_create_for_text(UNSAFE_TEMPLATE)
    NamedTemplate.objects.create(snapshot=model.current_snapshot, name="tool_use", version=tool_use)
    assert pipeline.request_missing_checks() == 2
    finish(CheckRun.objects.get(template_version=model.current_snapshot.default_template), "safe")
    finish(CheckRun.objects.get(template_version=tool_use), tool_use_verdict)
    model.refresh_from_db()
    assert model.verdict == verdict
    assert model.verdict_summary == (
        "No default template: transformers renders a request without tools only when the "
        'caller names a template (chat_template="rag" or "tool_use"); with tools it uses '
        f'"tool_use". Its “{worst}” template: {tool_use_verdict if worst == "tool_use" else "safe"}'
        " summary"
    )


def test_stalled_pending_runs_are_sent_again(sent: list[int]) -> None:
    add_model("org/stalled", SAFE_TEMPLATE)
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()
    assert pipeline.resend_stalled_checks() == 0  # young: its message is probably on its way
    CheckRun.objects.filter(pk=run.pk).update(
        created_at=run.created_at - 2 * pipeline.RESEND_PENDING_AFTER
    )
    assert pipeline.resend_stalled_checks() == 1
    finish(run, Verdict.SAFE)
    assert CheckRun.objects.get().status == CheckStatus.DONE
    assert pipeline.resend_stalled_checks() == 0


def test_a_duplicate_that_gets_the_lease_after_the_result_is_stored_does_not_redo_it(
    sent: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deliveries of one check: the second reads the run while the first is still on it,
    and takes the lease once the first has stored its result and let the lease go. It must
    find the run done then, not run the engine again (seen with a worker fed at once)."""
    from registry import jobs, tasks

    add_model("org/twice", SAFE_TEMPLATE)
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()
    acquire = jobs.acquire

    def the_first_finishes_meanwhile(key: str, ttl: Any) -> bool:
        finish(run, Verdict.SAFE)  # the other delivery stores its result, then releases
        return acquire(key, ttl)

    def engine(_run: CheckRun) -> dict[str, Any]:
        raise AssertionError("the engine ran again for a check already done")

    monkeypatch.setattr(jobs, "acquire", the_first_finishes_meanwhile)
    monkeypatch.setattr(tasks, "run_engine", engine)
    assert tasks.run_check.apply(args=(run.pk,)).get() == "done already"
    assert CheckRun.objects.get(pk=run.pk).status == CheckStatus.DONE
    assert not Lease.objects.exists()


def test_a_template_whose_error_holds_a_lone_surrogate_gets_its_verdict_stored(
    sent: list[int],
) -> None:
    """Jinja writes "\\ud800" as a lone surrogate, which no database takes: the report's text is
    stored as the database holds it, and the run is done with the template's error. Before,
    the write failed, and the run stayed running and was sent again for ever."""
    from registry import tasks

    model = add_model("org/surrogate", '{{ raise_exception("bad \\ud800 thing") }}')
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()
    assert tasks.run_check.apply(args=(run.pk,)).get() == "error"
    run.refresh_from_db()
    model.refresh_from_db()
    assert run.status == CheckStatus.DONE
    assert model.verdict == Verdict.ERROR and "bad ? thing" in model.verdict_summary


@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        (RuntimeError("a bug in storing"), "the check failed (RuntimeError: a bug in storing)"),
        (SoftTimeLimitExceeded(), f"the check took longer than {CHECK_SECONDS} s"),
    ],
)
def test_a_check_that_fails_as_no_check_should_ends_failed_and_is_not_sent_again(
    sent: list[int], monkeypatch: pytest.MonkeyPatch, raised: Exception, reason: str
) -> None:
    from registry import tasks

    add_model("org/failing", SAFE_TEMPLATE)
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()

    def failing(*args: Any) -> None:
        raise raised

    monkeypatch.setattr(pipeline, "store_result", failing)
    assert tasks.run_check.apply(args=(run.pk,)).get() == "failed"
    run.refresh_from_db()
    assert (run.status, run.error) == (CheckStatus.FAILED, reason)
    assert run.finished_at is not None and not Lease.objects.exists()
    CheckRun.objects.filter(pk=run.pk).update(
        created_at=run.created_at - 2 * pipeline.RESEND_PENDING_AFTER,
        started_at=run.created_at - 2 * pipeline.RESEND_PENDING_AFTER,
    )
    assert pipeline.resend_stalled_checks() == 0
    assert pipeline.request_missing_checks() == 0  # checked, and failed: not asked again


def test_a_check_task_outlasts_the_sandboxs_guard_on_a_render() -> None:
    """A render the machine starves of CPU ends at the sandbox's wall guard, as the template's
    verdict; the task's own time limit must not come first (both were 100 s)."""
    from checks import SandboxLimits
    from registry import tasks

    guard = SandboxLimits().wall_guard(float(settings.CHECK_CPU_SECONDS))
    assert tasks.run_check.soft_time_limit == CHECK_SECONDS >= guard + 20
    assert tasks.run_check.time_limit == CHECK_SECONDS + 20


@pytest.mark.parametrize("deaths", [2, 3])
def test_a_check_whose_sandbox_died_is_run_again_before_the_reason_is_its_verdict(
    sent: list[int], monkeypatch: pytest.MonkeyPatch, deaths: int
) -> None:
    """Killed by signal 9 (an operator, the machine's OOM killer, or the template's own
    memory: the reason cannot tell), a recheck replaced a safe verdict with an error and
    alerted its subscribers. The check runs again, up to twice, before the reason is kept."""
    from checks import TemplateSource
    from checks.reports import error_report
    from registry import tasks

    model = add_model("org/killed", SAFE_TEMPLATE)
    pipeline.dispatch_template_changes()
    run = CheckRun.objects.get()
    engine = tasks.run_engine
    calls: list[int] = []

    def dying(check: CheckRun) -> dict[str, Any]:
        calls.append(1)
        if len(calls) <= deaths:
            reason = "sandbox process died (signal 9), likely past 1 GiB of memory"
            source = TemplateSource({"default": check.template_version.text})
            return error_report(source, "", reason, 0.0, None).to_dict()
        return engine(check)

    monkeypatch.setattr(tasks, "run_engine", dying)
    tasks.run_check.apply(args=(run.pk,))
    run.refresh_from_db()
    model.refresh_from_db()
    assert len(calls) == 3  # the first run and two more, never a fourth
    if deaths == 2:
        assert (run.status, model.verdict) == (CheckStatus.DONE, Verdict.SAFE)
    else:  # it died every time: that is its verdict
        assert (run.status, model.verdict) == (CheckStatus.DONE, Verdict.ERROR)
        assert "sandbox process died (signal 9)" in model.verdict_summary
