"""The registry's own receivers: its announcements become Celery tasks (after commit) and
events. Connected in `RegistryConfig.ready`; the domain modules never import the tasks."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver
from django.utils import timezone

from .jobs import enqueue_on_commit
from .models import EventKind, HubModel, ModelEvent
from .signals import (
    check_requested,
    discovery_requested,
    status_changed,
    sync_requested,
    syncs_requested,
    template_changed,
)


@receiver(template_changed, dispatch_uid="registry.template_changed")
def _check_changed_templates(sender: Any, change_ids: list[int], **kwargs: Any) -> None:
    # One message for a sync's changes, or a batch of first syncs': they are claimed together.
    # If the broker is down they stay unclaimed in Postgres and the beat dispatcher picks
    # them up.
    enqueue_on_commit("workers.handle_template_changes", change_ids)


@receiver(sync_requested, dispatch_uid="registry.sync_requested")
def _sync(sender: Any, model_pk: int, force: bool = False, **kwargs: Any) -> None:
    enqueue_on_commit("hub.sync_repo", model_pk, force=force)


#: Repos one `hub.sync_repos` message syncs: a worker takes one message for all of them (a
#: message and its acknowledgement cost about as much as a first sync on a near Hub), and a
#: discovery's progress still moves in steps of this many.
SYNC_BATCH = 25


@receiver(syncs_requested, dispatch_uid="registry.syncs_requested")
def _sync_batches(sender: Any, model_pks: list[int], force: bool = False, **kwargs: Any) -> None:
    for start in range(0, len(model_pks), SYNC_BATCH):
        enqueue_on_commit("hub.sync_repos", model_pks[start : start + SYNC_BATCH], force=force)


@receiver(discovery_requested, dispatch_uid="registry.discovery_requested")
def _discover(sender: Any, run_id: int, **kwargs: Any) -> None:
    enqueue_on_commit("hub.discover", run_id)


@receiver(check_requested, dispatch_uid="registry.check_requested")
def _check(sender: Any, run_id: int, **kwargs: Any) -> None:
    # A lost send leaves the run pending: `request_missing_checks` re-sends stalled runs.
    enqueue_on_commit("workers.run_check", run_id)


@receiver(status_changed, dispatch_uid="registry.status_changed")
def _record_status_change(
    sender: Any, model_pk: int, old: str, new: str, reason: str, **kwargs: Any
) -> None:
    """A repo became gated, private, missing or disabled: an event subscribers can hear about."""
    repo_id = HubModel.objects.filter(pk=model_pk).values_list("repo_id", flat=True).first()
    ModelEvent.record(
        model_pk,
        EventKind.STATUS_CHANGED,
        key=f"status:{model_pk}:{old}:{new}:{timezone.now():%Y%m%d%H%M%S%f}",
        summary=f"{repo_id}: {old} → {new}" + (f" ({reason})" if reason else ""),
        data={"old": old, "new": new, "reason": reason},
    )
