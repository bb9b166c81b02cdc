"""Watches: find new repos of an author or a Hub query, and track them."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models.functions import Upper
from django.utils import timezone

from .hub import HubClient, HubUnavailable, RepoUnavailable
from .models import HubModel, Watch, WatchKind, validate_repo_id
from .tracking import enqueue_syncs, needs_first_sync


def refresh_watch(watch: Watch, client: HubClient, via: str = "watch") -> list[str]:
    """Track the repos of `watch` not tracked yet; return their ids (first sync is queued)."""
    return watch_results(watch, client, via=via)[1]


def watch_results(
    watch: Watch, client: HubClient, *, via: str = "watch", queue_syncs: bool = True
) -> tuple[list[str], list[str]]:
    """The repos `watch` lists now, and those of them tracked just now (their first sync
    queued unless `queue_syncs` is off: the caller syncs them itself)."""
    query = watch.query()
    sort = str(query["sort"])
    if watch.kind == WatchKind.AUTHOR and watch.last_run_at is not None:
        # After its first run an author's watch looks for what is new: a new repo has no
        # downloads yet, and never reaches an author's top 100 by downloads (mlx-community has
        # thousands of repos), but it is among the most recently modified.
        sort = "lastModified"
    try:
        found = list(
            client.iter_models(
                author=str(query["author"] or "") or None,
                search=str(query["search"] or "") or None,
                pipeline_tag=str(query["pipeline_tag"] or "") or None,
                tags=str(query["tags"] or "") or None,
                sort=sort,
                limit=int(query["limit"] or 100),
            )
        )
    except (HubUnavailable, RepoUnavailable) as err:
        Watch.objects.filter(pk=watch.pk).update(last_error=str(err)[:1000])
        raise
    valid = []
    for repo_id in found:
        try:
            valid.append(validate_repo_id(repo_id))
        except ValidationError:
            continue  # a malformed id from the Hub is skipped, not fatal
    # Known in any letters (the Hub's ids are case-insensitive, and a reader may have tracked
    # it as typed): before, such a repo was counted new, and a discovery run waited for it.
    tracked = HubModel.objects.annotate(upper_id=Upper("repo_id"))
    known = set(
        tracked.filter(upper_id__in=[r.upper() for r in valid]).values_list("upper_id", flat=True)
    )
    new = []
    waiting = []
    for repo_id in valid:
        if repo_id.upper() in known:
            continue
        model, created = HubModel.objects.track(repo_id, via=via)
        if created:
            new.append(repo_id)
        if needs_first_sync(model, created):
            waiting.append(model.pk)
    if queue_syncs:
        enqueue_syncs(waiting)
    Watch.objects.filter(pk=watch.pk).update(last_run_at=timezone.now(), last_error="")
    return valid, new


def refresh_watches(limit: int, client: HubClient | None = None) -> dict[str, list[str]]:
    """Refresh up to `limit` watches, stalest first; return the new repo ids per watch."""
    client = client or HubClient()
    found: dict[str, list[str]] = {}
    # Discovery's own watches run on its schedule (`DISCOVERY_EVERY_HOURS`, 0 for never), as
    # discovery runs that record themselves: before, this hourly task ran their queries too.
    for watch in Watch.objects.filter(discovery=False).stalest()[:limit]:
        try:
            found[str(watch)] = refresh_watch(watch, client)
        except (HubUnavailable, RepoUnavailable):
            continue  # recorded on the watch; the others still run
    return found
