"""Discovery: track the Hub's most used chat models without anyone typing a repo id.

The settings (DISCOVERY_*) stand for a few Hub queries: for each sort (downloads, trending) and
each pipeline tag (text-generation, image-text-to-text), the top DISCOVERY_LIMIT repos tagged
`conversational` (the Hub's tag for a model with a chat template). They are kept as watches
(`Watch.discovery`), so they show beside the hand-made ones. A run lists them, tracks what is
new and records itself as a DiscoveryRun; the new repos' first syncs are its progress, which
the catalog shows. It runs from `manage.py discover`, a staff button, and beat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from .models import DiscoveryRun, HubModel, ModelStatus, Watch, WatchKind

if TYPE_CHECKING:
    from .hub import HubClient
    from .sync import SyncResult

# The Hub client and the sync are imported by the functions that run a discovery: the site
# shows a run's progress (`latest`, `progress`) without loading either.

logger = logging.getLogger(__name__)

#: New repo ids a run keeps (its progress is counted over them).
MAX_RECORDED = 10_000


def discovery_watches(limit: int | None = None) -> list[Watch]:
    """The watches the discovery settings stand for (`limit` repos a query, else
    DISCOVERY_LIMIT); ones left from older settings go."""
    watches = []
    for sort in settings.DISCOVERY_SORTS:
        for pipeline_tag in settings.DISCOVERY_PIPELINE_TAGS:
            watch, _ = Watch.objects.get_or_create(
                kind=WatchKind.QUERY,
                author="",
                search="",
                pipeline_tag=pipeline_tag,
                tags=settings.DISCOVERY_TAGS,
                sort=sort,
                limit=limit or settings.DISCOVERY_LIMIT,
                defaults={"discovery": True},
            )
            watches.append(watch)
    Watch.objects.filter(discovery=True).exclude(pk__in=[w.pk for w in watches]).delete()
    return watches


def discover(
    client: HubClient | None = None,
    *,
    trigger: str,
    run: DiscoveryRun | None = None,
    queue_syncs: bool = True,
    limit: int | None = None,
) -> DiscoveryRun:
    """List the discovery queries and track what is new; never raises for the Hub (the run
    records why it stopped). New repos' first syncs are queued unless `queue_syncs` is off."""
    from .hub import HubClient, HubUnavailable, RepoUnavailable
    from .watching import watch_results

    run = run or DiscoveryRun.objects.create(trigger=trigger)
    client = client or HubClient()
    listed: set[str] = set()
    new: list[str] = []
    error = ""
    for watch in discovery_watches(limit):
        try:
            found, fresh = watch_results(watch, client, via="discovery", queue_syncs=queue_syncs)
        except (HubUnavailable, RepoUnavailable) as err:
            error = f"The Hub could not be read ({watch}): {err}"[:1000]
            break
        listed.update(r.lower() for r in found)
        new += [r for r in fresh if r not in new]
        DiscoveryRun.objects.filter(pk=run.pk).update(
            listed=len(listed), new=len(new), new_repo_ids=new[:MAX_RECORDED]
        )
    DiscoveryRun.objects.filter(pk=run.pk).update(
        listed=len(listed),
        new=len(new),
        new_repo_ids=new[:MAX_RECORDED],
        error=error,
        finished_at=timezone.now(),
    )
    run.refresh_from_db()
    logger.info("discovery %s: %d listed, %d new%s", run.pk, len(listed), len(new), error)
    return run


def sync_new(
    run: DiscoveryRun,
    *,
    concurrency: int,
    client: HubClient | None = None,
    on_result: Callable[[SyncResult], None] | None = None,
) -> list[SyncResult]:
    """Sync the repos `run` tracked that are still pending, `concurrency` at a time."""
    from .sync import sync_concurrently

    models = list(HubModel.objects.filter(repo_id__in=run.new_repo_ids, status=ModelStatus.PENDING))
    return sync_concurrently(models, concurrency=concurrency, client=client, on_result=on_result)


@dataclass(frozen=True)
class Progress:
    """How far a run's new repos got: the numbers the catalog shows."""

    run: DiscoveryRun
    read: int
    failing: int

    @property
    def waiting(self) -> int:
        return max(0, self.run.new - self.read)

    @property
    def done(self) -> bool:
        return self.run.finished_at is not None and self.waiting == 0

    @property
    def percent(self) -> int:
        return 100 if not self.run.new else round(100 * self.read / self.run.new)


def progress(run: DiscoveryRun) -> Progress:
    """One query: of the run's new repos, how many were read, how many wait on a failing Hub."""
    pending = Q(status=ModelStatus.PENDING)
    counts = HubModel.objects.filter(repo_id__in=run.new_repo_ids).aggregate(
        read=Count("pk", filter=~pending),
        failing=Count("pk", filter=pending & ~Q(sync_error="")),
    )
    return Progress(run, int(counts["read"]), int(counts["failing"]))


def latest() -> DiscoveryRun | None:
    return DiscoveryRun.objects.first()


def due(now: datetime | None = None) -> bool:
    """A scheduled run is due: discovery is on and the last run is older than its interval."""
    hours = int(settings.DISCOVERY_EVERY_HOURS)
    if hours <= 0:
        return False
    last = latest()
    moment = now or timezone.now()
    return last is None or last.started_at <= moment - timedelta(hours=hours)
