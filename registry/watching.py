"""Watches: find new repos of an author or a Hub query, and track them."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.utils import timezone

from .hub import HubClient, HubUnavailable, RepoUnavailable
from .models import HubModel, Watch, validate_repo_id
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
    try:
        found = list(
            client.iter_models(
                author=str(query["author"] or "") or None,
                search=str(query["search"] or "") or None,
                pipeline_tag=str(query["pipeline_tag"] or "") or None,
                tags=str(query["tags"] or "") or None,
                sort=str(query["sort"]),
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
    known = set(HubModel.objects.filter(repo_id__in=valid).values_list("repo_id", flat=True))
    new = [r for r in valid if r not in known]
    waiting = []
    for repo_id in new:
        model, created = HubModel.objects.track(repo_id, via=via)
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
    for watch in Watch.objects.stalest()[:limit]:
        try:
            found[str(watch)] = refresh_watch(watch, client)
        except (HubUnavailable, RepoUnavailable):
            continue  # recorded on the watch; the others still run
    return found
