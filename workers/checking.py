"""Tasks on the `checks` queue: run the engine on one template version, store the report."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from celery import Task
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from checks import SandboxPool, TemplateSource, check_template
from registry.models import CheckRun, CheckStatus

from . import leases, pipeline
from .celery import app
from .locks import single_running
from .tokenizer_files import HubUnavailable, TokenizerUnavailable, tokenizer_text

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


class HubBusy(Exception):
    """The Hub did not hand over a tokenizer.json this time; the check is retried later."""


def run_engine(run: CheckRun) -> dict[str, Any]:
    """Check the version, token by token when the run names a tokenizer.json that can be had."""
    version = run.template_version
    source = TemplateSource(
        {"default": version.text},
        special_tokens=pipeline.special_tokens_for(version),
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
        wall_seconds=settings.CHECK_WALL_SECONDS,
    ).to_dict()
    if skipped:
        # Said on the page, so nobody takes a bytes-only verdict for a token-level one.
        report["summary"] = f"{report['summary']} (Checked on bytes only: {skipped}.)"
    return report


@app.task(
    name="workers.run_check",
    queue_name="checks",
    bind=True,
    acks_late=True,
    autoretry_for=(OperationalError, InterfaceError, HubBusy),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=30,
    soft_time_limit=100,
    time_limit=120,
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
    if not leases.acquire(key, CHECK_LEASE):
        # Someone alive is on it; look again later (it will be done by then, or its lease over).
        raise self.retry(countdown=5, max_retries=None)
    try:
        CheckRun.objects.filter(pk=run_id).update(
            status=CheckStatus.RUNNING, started_at=timezone.now(), progress=10
        )
        logger.info("check %s: running the engine on %s", run_id, run.template_version.sha256)
        report = run_engine(run)
        pipeline.store_result(run_id, report)
        return str(report["verdict"])
    finally:
        try:
            leases.release(key)
        except (OperationalError, InterfaceError):
            logger.warning("could not release %s; it expires by itself", key)


@app.task(name="workers.handle_template_change", queue_name="default", acks_late=True)
def handle_template_change(change_id: int) -> bool:
    """Act on one template change right after the sync that found it (claimed: runs once)."""
    return pipeline.claim_template_change(change_id)


@app.task(name="workers.dispatch_template_changes", queue_name="default", acks_late=True)
def dispatch_template_changes(limit: int = 200) -> int:
    """Turn new template changes into events and checks (each change handled once)."""
    with single_running("dispatch_template_changes", ttl=300) as mine:
        return pipeline.dispatch_template_changes(limit) if mine else 0


@app.task(name="workers.request_missing_checks", queue_name="default", acks_late=True)
def request_missing_checks(limit: int = 500) -> int:
    """Check versions in use that the current engine has not checked (after an engine upgrade)."""
    with single_running("request_missing_checks", ttl=600) as mine:
        if not mine:
            return 0
        return pipeline.request_missing_checks(limit) + pipeline.resend_stalled_checks(limit)
