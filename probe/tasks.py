"""The Mac worker's one task (queue `mlx`): measure a model, hand the report to the main side.

The Mac has no database. Its answers go back as tasks by name (`registry.tasks` defines
them): the Mac never imports the service's code, and the service never imports mlx.
"""

from __future__ import annotations

import socket
from typing import Any

from celery import current_app, shared_task

from probe.runner import run_probe

#: Real models at 32k tokens take long on the Mac; the broker's visibility timeout (3600 s) is
#: above the hard limit so an unfinished probe is never handed to a second worker meanwhile.
PROBE_SOFT_LIMIT = 3000
PROBE_HARD_LIMIT = 3300


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
