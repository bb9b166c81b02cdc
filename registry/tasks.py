"""The registry's Celery tasks: sync repos with the Hub, check template versions, store what the
Mac probe measured. Each takes primary keys and re-fetches; queues come from the routing table
in `workers.celery` (by task name), and `registry.receivers` enqueues them after commit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import Task, current_app, shared_task
from celery.exceptions import Retry, SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from checks import SandboxLimits, SandboxPool, TemplateSource, check_template
from checks.reports import checked_on_bytes
from checks.sandbox import uncertain

from . import discovery, jobs, pipeline
from .hub import HubUnavailable
from .jobs import single_running
from .models import CheckRun, CheckStatus, DiscoveryRun, HubModel, ProbeRun, ProbeState
from .probes import store_report
from .sync import RegistrySync, backfill_histories, sync_batch, sync_failed, sync_stalest
from .tokenizer_files import TokenizerUnavailable, tokenizer_text
from .watching import refresh_watches as refresh_all_watches

logger = logging.getLogger(__name__)

#: Longer than the task's hard time limit, so a live holder never loses its lease.
CHECK_LEASE = timedelta(seconds=180)
_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def sandbox_pool() -> SandboxPool:
    """One sandbox process per Celery worker process, started on first use (after the fork)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SandboxPool(size=1)
        return _pool


#: A check task's time (its soft limit; the hard one 20 s later): 20 s past the sandbox's
#: guard on a render's wall time for the CPU budget (100 s for the default 10 s), so that a
#: render the machine starves of CPU ends as the template's verdict, not as the task's time
#: limit (at 100 s both, the limit could come first and leave the run unfinished).
CHECK_SECONDS = int(SandboxLimits().wall_guard(float(settings.CHECK_CPU_SECONDS))) + 20


#: A check whose sandbox died or went silent is run again this many times before the reason
#: is kept as the template's verdict, this long apart (`checks.sandbox.UNCERTAIN_REASONS`).
UNCERTAIN_RETRIES = 2
UNCERTAIN_RETRY_SECONDS = 30


class HubBusy(Exception):
    """The Hub did not hand over a tokenizer.json this time; the check is retried later."""


def run_engine(run: CheckRun) -> dict[str, Any]:
    """Check the version, token by token when the run names a tokenizer.json that can be had."""
    version = run.template_version
    source = TemplateSource(
        {"default": version.text},
        special_tokens=version.special_tokens(),
        origin="registry",
    )
    tokenizer_json, skipped = None, ""
    if run.tokenizer_sha:
        try:
            tokenizer_json = tokenizer_text(run.tokenizer_sha)
        except TokenizerUnavailable as exc:
            skipped = str(exc)
        except HubUnavailable as exc:
            raise HubBusy(str(exc)) from exc
    report = check_template(
        source,
        file=version.sha256,
        tokenizer_json=tokenizer_json,
        pool=sandbox_pool(),
        cache=None,
        cpu_seconds=settings.CHECK_CPU_SECONDS,
    ).to_dict()
    if skipped:
        report["summary"] = checked_on_bytes(report["summary"], skipped)
    return report


@shared_task(
    name="workers.run_check",
    bind=True,
    acks_late=True,
    autoretry_for=(OperationalError, InterfaceError, HubBusy),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=30,
    soft_time_limit=CHECK_SECONDS,
    time_limit=CHECK_SECONDS + 20,
)
def run_check(self: Task[Any, Any], run_id: int) -> str:
    """Check one template version. Idempotent: a duplicate or retried delivery acts once."""
    run = CheckRun.objects.select_related("template_version").filter(pk=run_id).first()
    if run is None:
        logger.info("check run %s is gone; nothing to do", run_id)
        return "gone"
    if run.status == CheckStatus.DONE:
        return "done already"
    key = f"check:{run_id}"
    if not jobs.acquire(key, CHECK_LEASE):
        # Someone alive is on it; look again later (it will be done by then, or its lease over).
        raise self.retry(countdown=5, max_retries=None)
    try:
        # Read again under the lease: a duplicate that read the run before another delivery
        # stored its result, and took the lease once that one let it go, must not redo it.
        if (
            not CheckRun.objects.filter(pk=run_id)
            .exclude(status=CheckStatus.DONE)
            .update(status=CheckStatus.RUNNING, started_at=timezone.now(), progress=10)
        ):
            return "done already"
        logger.info("check %s: running the engine on %s", run_id, run.template_version.sha256)
        try:
            report = run_engine(run)
            if uncertain(report.get("reason")) and self.request.retries < UNCERTAIN_RETRIES:
                # A killed or silent sandbox may not be the template's doing: checked again
                # before the reason replaces a verdict (and alerts its subscribers).
                logger.warning("check %s: %s; checking again", run_id, report.get("reason"))
                raise self.retry(countdown=UNCERTAIN_RETRY_SECONDS, max_retries=UNCERTAIN_RETRIES)
            pipeline.store_result(run_id, report)
        except (OperationalError, InterfaceError, HubBusy, Retry):
            raise  # retried later (`autoretry_for`, or just above)
        except SoftTimeLimitExceeded:
            pipeline.record_failure(run_id, f"the check took longer than {CHECK_SECONDS} s")
            return "failed"
        except Exception as exc:
            logger.error("check %s failed", run_id, exc_info=exc)
            pipeline.record_failure(run_id, f"the check failed ({type(exc).__name__}: {exc})")
            return "failed"
        return str(report["verdict"])
    finally:
        try:
            jobs.release(key)
        except (OperationalError, InterfaceError):
            logger.warning("could not release %s; it expires by itself", key)


@shared_task(name="workers.handle_template_changes", acks_late=True)
def handle_template_changes(change_ids: list[int]) -> int:
    """Act on the template changes a sync (or a batch of first syncs) found, right after it;
    each is claimed, so it runs once. Returns how many this call claimed."""
    return pipeline.claim_template_changes(ids=change_ids, limit=len(change_ids))


@shared_task(name="workers.handle_template_change", acks_late=True)
def handle_template_change(change_id: int) -> bool:
    """One template change: what syncs sent before `handle_template_changes` (a message may
    still wait in a queue after an upgrade)."""
    return pipeline.claim_template_change(change_id)


@shared_task(name="workers.dispatch_template_changes", acks_late=True)
def dispatch_template_changes(limit: int = 200) -> int:
    """Turn new template changes into events and checks (each change handled once)."""
    with single_running("dispatch_template_changes", ttl=300) as mine:
        return pipeline.dispatch_template_changes(limit) if mine else 0


@shared_task(name="workers.request_missing_checks", acks_late=True)
def request_missing_checks(limit: int = 500) -> int:
    """Check versions in use that the current engine has not checked (after an engine upgrade)."""
    with single_running("request_missing_checks", ttl=600) as mine:
        if not mine:
            return 0
        return pipeline.request_missing_checks(limit) + pipeline.resend_stalled_checks(limit)


#: Beat runs of the batch jobs stop starting syncs after this many seconds (below the limits).
BATCH_SECONDS = 420


@shared_task(
    name="hub.sync_repo",
    bind=True,
    acks_late=True,
    max_retries=6,
    soft_time_limit=240,
    time_limit=300,
)
def sync_repo(self: Task[Any, Any], model_pk: int, force: bool = False) -> str:
    """Sync one tracked model; retried later when the Hub is down or rate-limits us."""
    model = HubModel.objects.filter(pk=model_pk).first()
    if model is None:
        logger.info("model %s is gone; nothing to sync", model_pk)
        return "gone"
    try:
        result = RegistrySync().sync(model, force=force)
    except HubUnavailable as err:
        countdown = err.retry_after or min(3600, 60 * 2**self.request.retries)
        raise self.retry(countdown=countdown, exc=err) from err
    except SoftTimeLimitExceeded as exc:
        result = sync_failed(model, "in the task's time", exc)
    except (OperationalError, InterfaceError):
        raise  # the database: nothing can be noted on the model either
    except Exception as exc:  # noted on the model, as a batch notes it (`sync_failed`)
        result = sync_failed(model, "syncing the repo", exc)
    logger.info("%s", result.line())
    return result.outcome


#: The batch jobs: bounded, acks_late (a rerun only repeats idempotent syncs), single-running.
BATCH_OPTIONS: dict[str, Any] = {
    "acks_late": True,
    "soft_time_limit": BATCH_SECONDS + 60,
    "time_limit": BATCH_SECONDS + 120,
}


def _single_running(name: str, job: Callable[[], int]) -> int:
    """Run `job` unless another run of `name` holds the lock (a duplicate beat tick)."""
    with single_running(name, ttl=BATCH_SECONDS + 180) as mine:
        return job() if mine else 0


@shared_task(
    name="hub.sync_repos",
    bind=True,
    acks_late=True,
    max_retries=6,
    soft_time_limit=BATCH_SECONDS + 60,
    time_limit=BATCH_SECONDS + 120,
)
def sync_repos(self: Task[Any, Any], model_pks: list[int], force: bool = False) -> int:
    """Sync a batch of tracked models (a discovery's or a watch's new repos; see
    `registry.receivers.SYNC_BATCH`), `REGISTRY_SYNC_CONCURRENCY` at a time as the beat's
    batches are; return how many were synced. The rest are retried together later, after the
    wait the Hub asked for, else with the same backoff as `hub.sync_repo`; past the retries
    they are still never synced, which the beat's `hub.sync_stalest` takes first."""
    results, again = sync_batch(
        model_pks, force=force, concurrency=int(settings.REGISTRY_SYNC_CONCURRENCY)
    )
    for result in results:
        logger.info("%s", result.line())
    if again:
        waits = [r.retry_after for r in results if r.retry_after is not None]
        countdown = max(waits, default=0.0) or min(3600, 60 * 2**self.request.retries)
        failed = next((r.message for r in results if r.outcome == "failed"), "")
        raise self.retry(
            args=(again,),
            kwargs={"force": force},
            countdown=countdown,
            exc=HubUnavailable(f"{len(again)} of {len(model_pks)} repos to sync again: {failed}"),
        )
    return len(results)


@shared_task(name="hub.sync_stalest", **BATCH_OPTIONS)
def sync_stalest_repos(limit: int = 200) -> int:
    """Sync the repos synced longest ago (one request each when unchanged)."""
    concurrency = int(settings.REGISTRY_SYNC_CONCURRENCY)
    return _single_running(
        "hub.sync_stalest",
        lambda: len(sync_stalest(limit, seconds=BATCH_SECONDS, concurrency=concurrency)),
    )


@shared_task(name="hub.backfill_history", **BATCH_OPTIONS)
def backfill_history(limit: int = 100) -> int:
    """Read the histories that first syncs left for later (a new repo's verdict comes first)."""
    return _single_running(
        "hub.backfill_history", lambda: len(backfill_histories(limit, seconds=BATCH_SECONDS))
    )


@shared_task(name="hub.refresh_watches", **BATCH_OPTIONS)
def refresh_watches(limit: int = 50) -> int:
    """Track the new repos of watched authors and queries (their first sync is queued)."""
    return _single_running(
        "hub.refresh_watches",
        lambda: sum(len(new) for new in refresh_all_watches(limit).values()),
    )


@shared_task(name="hub.discover", **BATCH_OPTIONS)
def discover_hub(run_id: int | None = None) -> int:
    """A discovery run: the one a staff member asked for (`run_id`), else a scheduled one when
    it is due (DISCOVERY_EVERY_HOURS). The new repos' first syncs are queued."""

    def job() -> int:
        run = DiscoveryRun.objects.filter(pk=run_id).first() if run_id is not None else None
        if run is None:
            if run_id is not None or not discovery.due():
                return 0
            run = DiscoveryRun.objects.create(trigger="schedule")
        return discovery.discover(trigger=run.trigger, run=run).new

    return _single_running("hub.discover", job)


@shared_task(name="workers.probe_started", acks_late=True)
def probe_started(run_id: int, worker: str) -> None:
    ProbeRun.objects.filter(pk=run_id, state=ProbeState.QUEUED).update(
        state=ProbeState.RUNNING, worker=worker, started_at=timezone.now()
    )


@shared_task(
    name="workers.store_probe_report", acks_late=True, bind=True,
    autoretry_for=(OperationalError, InterfaceError), max_retries=10, default_retry_delay=30,
)  # fmt: skip
def store_probe_report(self: Task[Any, Any], run_id: int, report: dict[str, Any]) -> str:
    run = store_report(run_id, report)
    return run.state if run else "gone"


@shared_task(name="registry.flush_outbox", acks_late=True, soft_time_limit=60, time_limit=75)
def flush_outbox(limit: int = jobs.FLUSH_BATCH) -> int:
    """Beat: send what a broker outage kept in the outbox (by task name, routed as usual)."""
    with single_running("registry.flush_outbox", ttl=120) as mine:
        return jobs.flush_outbox(current_app.send_task, limit=limit) if mine else 0
