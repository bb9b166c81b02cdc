"""Background work: the Celery app (`workers.celery`, which `celery -A workers` finds), its tasks
and the Mac probe.

Nothing here imports Celery: a process that only serves pages (a web worker) never loads it; one
that sends a task loads the app then (`registry.jobs`).
"""
