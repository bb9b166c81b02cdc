"""Signals of the alerts app.

`send_requested(sender=Delivery, task_name, pk)`: `alerts.delivery` wants one of its tasks run
on a row once the transaction commits; `alerts.receivers` sends it.
"""

from __future__ import annotations

from django.dispatch import Signal

send_requested = Signal()
