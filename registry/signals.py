"""Signals the registry sends.

`template_changed(sender=TemplateChange, change_id=int)`: a repo's templates changed at a commit
(a new TemplateChange row). Sent once per new row, after the sync's transaction commits, so a
receiver can enqueue work that reads the row. A re-sync that finds the row already there sends
nothing.

`status_changed(sender=HubModel, model_pk=int, old=str, new=str, reason=str)`: a sync found the
repo gated, private, missing or disabled where it was not before. Sent inside the sync's
transaction, so what a receiver writes commits (or not) with the status itself.
"""

from __future__ import annotations

from django.dispatch import Signal

template_changed = Signal()
status_changed = Signal()
