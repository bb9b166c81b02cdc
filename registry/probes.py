"""Cache-reuse probes: queued here, run by the Mac worker (queue `mlx`), stored back here.

The Mac worker has no database: `probe_model` gets everything in its job and answers with a
task on the `default` queue that a main worker stores. The job carries the check engine's own
sessions, so a page can put the template's prediction beside the engine's measurement.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from checks.conversations import SESSIONS, TOOLS
from probe.limits import PROBE_HARD_LIMIT, PROBE_SOFT_LIMIT

from .jobs import enqueue_on_commit
from .models import (
    PROBE_SEVERITY,
    EventKind,
    HubModel,
    ModelEvent,
    ModelStatus,
    ProbeRun,
    ProbeState,
    ProbeVerdict,
)
from .storable import storable
from .verdicts import record_probe

logger = logging.getLogger(__name__)

#: The Mac runs one model at a time: keep only this many probes waiting for it.
MAX_WAITING = 3


def probe_job(model: HubModel, *, model_dir: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Everything the Mac worker needs to probe `model` at its current commit."""
    sessions = {
        s.name: {"messages": list(s.messages), "tools": TOOLS if s.uses_tools else None}
        for s in SESSIONS
        if len(s.request_ends()) >= 2
    }
    job: dict[str, Any] = {
        "repo_id": model.repo_id,
        "revision": model.last_commit_sha or "main",
        "quantization": model.quantization,
        "conversations": sessions,
        "prompt_sizes": list(settings.PROBE_PROMPT_SIZES),
        "paths": list(settings.PROBE_PATHS),
        "deadline_s": PROBE_SOFT_LIMIT - 120,
    }
    if model_dir:
        job["model_dir"] = model_dir
    else:
        # The Mac's own HF_TOKEN is used there: no credential travels through the broker.
        job["download"] = {
            "endpoint": settings.HF_ENDPOINT,
            "disk_budget_bytes": settings.PROBE_DISK_BUDGET_BYTES,
        }
    job.update(overrides)
    return job


def request_probe(model: HubModel, **job_options: Any) -> ProbeRun:
    """Queue a probe of `model`; it is sent to the Mac worker after the transaction commits."""
    run = ProbeRun.objects.create(
        model=model, commit_sha=model.last_commit_sha, quantization=model.quantization
    )
    job = probe_job(model, **job_options)

    enqueue_on_commit("workers.probe_model", run.pk, job)
    return run


def request_probe_once(model: HubModel) -> ProbeRun:
    """The probe of `model` already waiting for the Mac worker, or a new one."""
    with transaction.atomic():
        HubModel.objects.select_for_update().filter(pk=model.pk).first()
        waiting = ProbeRun.objects.waiting().filter(model=model).order_by("-queued_at").first()
        return waiting or request_probe(model)


#: A probe running longer than this gets no report: its worker died or nothing stopped it.
STALE_AFTER = timedelta(seconds=PROBE_HARD_LIMIT + 600)


def expire_stale_probes() -> int:
    """Fail the probes that have been running for longer than any probe can: they would wait
    for ever and hold the queue's places. A report that still comes is stored (store_report)."""
    now = timezone.now()
    return ProbeRun.objects.filter(
        state=ProbeState.RUNNING, started_at__lt=now - STALE_AFTER
    ).update(
        state=ProbeState.ERROR,
        error="no report from the Mac worker: it stopped or the probe never ended",
        finished_at=now,
    )


def request_due_probes(limit: int = MAX_WAITING) -> int:
    """Queue probes for the most downloaded models not yet probed at their current commit."""
    expire_stale_probes()
    room = limit - ProbeRun.objects.waiting().count()
    if room <= 0:
        return 0
    probed = ProbeRun.objects.filter(model=OuterRef("pk"), commit_sha=OuterRef("last_commit_sha"))
    due = (
        HubModel.objects.filter(status=ModelStatus.OK)
        .exclude(current_snapshot=None)
        .exclude(Q(last_commit_sha="") | Q(is_demo=True))
        .exclude(pk__in=ProbeRun.objects.waiting().values("model"))
        .annotate(probed=Exists(probed))
        .filter(probed=False)
        .order_by("-downloads", "pk")[:room]
    )
    queued = 0
    with transaction.atomic():
        for model in due:
            # As request_probe_once: the model's row locked, then asked again what waits, so a
            # staff member's probe queued meanwhile is not queued twice.
            HubModel.objects.select_for_update().filter(pk=model.pk).first()
            if not ProbeRun.objects.waiting().filter(model=model).exists():
                request_probe(model)
                queued += 1
    return queued


def overall(report: dict[str, Any]) -> tuple[str, float | None, bool]:
    """Worst verdict, lowest reused share, and whether any result disagrees with the template.
    Raises BadReport for a result whose reused share is not a number from 0 to 1."""
    results = [
        r
        for r in report.get("results") or []
        if isinstance(r, dict) and r.get("verdict") in ProbeVerdict.values
    ]
    if not results:
        return "", None, False
    worst = max(results, key=lambda r: PROBE_SEVERITY[ProbeVerdict(r["verdict"])])["verdict"]
    shares = [share(r.get("reused_share")) for r in results if r.get("reused_share") is not None]
    return worst, (min(shares) if shares else None), any(r.get("disagreement") for r in results)


class BadReport(ValueError):
    """A probe report that cannot be what the probe sends; the message says why."""


def share(value: Any) -> float:
    """A reused share as the report gives it: a number from 0 to 1, else BadReport."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise BadReport(f"a reused share of {str(value)[:40]!r}, not a number from 0 to 1")
    return float(value)


def store_report(run_id: int, report: dict[str, Any]) -> ProbeRun | None:
    """Save the Mac worker's report (idempotent) and record a change of the probe verdict."""
    with transaction.atomic():
        run = ProbeRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            logger.info("probe %s is gone; dropping its report", run_id)
            return None
        if run.state == ProbeState.DONE or (run.state == ProbeState.ERROR and run.report):
            return run  # a redelivery; a late report of an expired probe is still stored
        if not isinstance(report, dict):
            report = {"status": "error", "error": "the report is not an object", "sent": report}
        try:  # read as sent (NaN is no share), stored as a JSON column holds it
            if not isinstance(report.get("results") or [], list):
                raise BadReport("its results are not a list")
            verdict, lowest, disagreement = overall(report)
            report = storable(report)
        except BadReport as bad:
            report = storable(report)
            # Kept as sent, for whoever looks into the probe, but it measured nothing usable.
            verdict, lowest, disagreement = "", None, False
            report = {**report, "status": "error", "error": f"the report is not usable: {bad}"}
        ok = report.get("status") == "ok"
        if ok and not verdict:  # every result failed or was skipped: nothing was measured
            ok = False
            errors = [
                str(r.get("error"))
                for r in report.get("results") or []
                if isinstance(r, dict) and r.get("error")
            ]
            report = {
                **report,
                "status": "error",
                "error": "the probe measured nothing" + (f": {errors[0]}" if errors else ""),
            }
        run.state = ProbeState.DONE if ok else ProbeState.ERROR
        run.verdict = verdict
        run.reused_share = lowest
        run.disagreement = disagreement
        run.report = report
        machine = report.get("machine")
        run.machine = machine if isinstance(machine, dict) else {}
        run.error = "" if ok else str(report.get("error") or "the probe failed")[:2000]
        run.finished_at = timezone.now()
        run.save()
        record_probe(run)
        previous = (
            ProbeRun.objects.filter(model=run.model, state=ProbeState.DONE)
            .exclude(pk=run.pk)
            .order_by("-finished_at")
            .first()
        )
        if ok and previous is not None and previous.verdict != verdict:
            ModelEvent.record(
                run.model_id,
                EventKind.PROBE_CHANGED,
                key=f"probe:{run.pk}",
                summary=f"{run.model.repo_id}: mlx-lm probe {previous.verdict} → {verdict}",
                data={"old": previous.verdict, "new": verdict, "probe_run_id": run.pk},
            )
    return run
