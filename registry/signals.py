"""Signals the registry sends.

`template_changed(sender=TemplateChange, change_id=int)`: a repo's templates changed at a commit
(a new TemplateChange row). Sent once per new row, after the sync's transaction commits, so a
receiver can enqueue work that reads the row. A re-sync that finds the row already there sends
nothing.
"""

from __future__ import annotations

from django.dispatch import Signal

template_changed = Signal()
