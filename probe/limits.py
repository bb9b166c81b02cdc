"""How long a probe may run: the Mac task's limits, and the deadline the main side puts in a job.

Apart from `probe.tasks` so that the main side reads them without importing Celery's task or the
runner.
"""

from __future__ import annotations

#: Real models at 32k tokens take long on the Mac; the broker's visibility timeout (3600 s) is
#: above the hard limit so an unfinished probe is never handed to a second worker meanwhile.
PROBE_SOFT_LIMIT = 3000
PROBE_HARD_LIMIT = 3300
