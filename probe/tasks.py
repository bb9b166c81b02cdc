"""The Mac worker's one task (queue `mlx`): measure a model, hand the report to the main side.

The Mac has no database. Its answers go back as tasks by name (`registry.tasks` defines
them): the Mac never imports the service's code, and the service never imports mlx.
"""

from __future__ import annotations

import socket
from typing import Any

from celery import current_app, shared_task

from probe.limits import PROBE_HARD_LIMIT, PROBE_SOFT_LIMIT
from probe.runner import run_probe


@shared_task(
    name="workers.probe_model",
    acks_late=True,
    soft_time_limit=PROBE_SOFT_LIMIT,
    time_limit=PROBE_HARD_LIMIT,
)
def probe_model(run_id: int, job: dict[str, Any]) -> str:
    """On the Mac: measure, then hand the report to the main side. Touches no database."""
    current_app.send_task("workers.probe_started", args=[run_id, socket.gethostname()])
    report = run_probe(job)
    current_app.send_task("workers.store_probe_report", args=[run_id, report])
    return str(report.get("status"))
