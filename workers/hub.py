"""Tasks on the `hub` queue: sync tracked repos with the Hub and refresh watches.

They take primary keys and re-fetch; a sync writes in one transaction and a second run of the
same commit writes nothing, so `sync_repo` is safe to redeliver (acks_late).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Task

from registry.hub import HubUnavailable
from registry.models import HubModel
from registry.sync import RegistrySync, sync_stalest
from registry.watching import refresh_watches as refresh_all_watches

from .celery import app
from .locks import single_running

logger = logging.getLogger(__name__)

#: Beat runs of the batch jobs stop starting syncs after this many seconds (below the limits).
BATCH_SECONDS = 420


@app.task(
    name="hub.sync_repo",
    queue_name="hub",
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
    logger.info("%s", result.line())
    return result.outcome


#: The batch jobs: bounded, acks_late (a rerun only repeats idempotent syncs), single-running.
BATCH_OPTIONS: dict[str, Any] = {
    "queue_name": "hub",
    "acks_late": True,
    "soft_time_limit": BATCH_SECONDS + 60,
    "time_limit": BATCH_SECONDS + 120,
}


def _single_running(name: str, job: Callable[[], int]) -> int:
    """Run `job` unless another run of `name` holds the lock (a duplicate beat tick)."""
    with single_running(name, ttl=BATCH_SECONDS + 180) as mine:
        return job() if mine else 0


@app.task(name="hub.sync_stalest", **BATCH_OPTIONS)
def sync_stalest_repos(limit: int = 200) -> int:
    """Sync the repos synced longest ago (one request each when unchanged)."""
    return _single_running(
        "hub.sync_stalest", lambda: len(sync_stalest(limit, seconds=BATCH_SECONDS))
    )


@app.task(name="hub.refresh_watches", **BATCH_OPTIONS)
def refresh_watches(limit: int = 50) -> int:
    """Track the new repos of watched authors and queries (their first sync is queued)."""
    return _single_running(
        "hub.refresh_watches",
        lambda: sum(len(new) for new in refresh_all_watches(limit).values()),
    )
