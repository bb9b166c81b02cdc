"""Who is running a job right now: the lease a task claims before it acts."""

from __future__ import annotations

from django.db import models


class Lease(models.Model):
    """Who is working on a job right now (`key`), until when.

    A task claims the lease before acting; a second delivery of the same task finds it held by a
    live worker and waits. A holder that died (SIGKILL, OOM) loses the lease as soon as its death
    is visible (same host, pid gone) or when the lease expires.
    """

    key = models.CharField(max_length=200, unique=True)
    holder = models.CharField(max_length=255)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.key} held by {self.holder}"
