"""Signals the registry sends: how it announces work and changes to whoever acts on them, so
that it never imports the layers above it (or its own task module).

Each is sent inside the transaction that made the change; a receiver that enqueues work or
expires caches does so after commit (`registry.jobs.enqueue_on_commit`, `transaction.on_commit`).

- `template_changed(sender=TemplateChange, change_ids)`: new TemplateChange rows (each sent
  once), those a sync or a batch of syncs recorded together.
- `status_changed(sender=HubModel, model_pk, old, new, reason)`: the repo became gated, private,
  missing or disabled.
- `sync_requested(sender=HubModel, model_pk)`: a model was tracked and needs its first sync.
- `syncs_requested(sender=HubModel, model_pks)`: several were tracked at once (a discovery, a
  watch) and need their first syncs, in batches.
- `check_requested(sender=CheckRun, run_id)`: a check run is pending and needs the engine.
- `events_recorded(sender=ModelEvent)`: events were bulk-created (no post_save was sent).
- `discovery_requested(sender=DiscoveryRun, run_id)`: a discovery run was asked for (button).
- `catalog_changed(sender=HubModel, model_ids, shown=None, verdicts=False)`: rows listing pages
  show changed without a post_save (bulk updates); `model_ids` None means any model. `shown`,
  when the sender has it at hand, maps some of those ids to what their pages show as of the
  commit: the repo id and the SHA-256 of each current template (default and named).
  `verdicts`: only their verdicts changed (the model row's and its catalog row's), not what a
  search or a filter other than a verdict's would find.
"""

from __future__ import annotations

from django.dispatch import Signal

template_changed = Signal()
status_changed = Signal()
sync_requested = Signal()
syncs_requested = Signal()
check_requested = Signal()
events_recorded = Signal()
catalog_changed = Signal()
discovery_requested = Signal()
