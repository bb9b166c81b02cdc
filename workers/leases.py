"""Leases in the database: claim a job so that a duplicate delivery or a retry acts only once."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from registry.models import Lease


def current_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_is_dead(holder: str) -> bool:
    """True only when the holder ran on this host and its process is gone."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def acquire(key: str, ttl: timedelta) -> bool:
    """Claim `key` for `ttl`; True if this process now holds it."""
    me = current_holder()
    now = timezone.now()
    try:
        with transaction.atomic():
            Lease.objects.create(key=key, holder=me, expires_at=now + ttl)
        return True
    except IntegrityError:
        pass
    lease = Lease.objects.filter(key=key).first()
    if lease is None:
        return acquire(key, ttl)
    if lease.holder == me:
        return True
    if lease.expires_at >= now and not holder_is_dead(lease.holder):
        return False
    # Compare-and-swap: of several processes taking over a dead lease, one wins.
    return (
        Lease.objects.filter(pk=lease.pk, holder=lease.holder, expires_at=lease.expires_at).update(
            holder=me, expires_at=now + ttl
        )
        == 1
    )


def release(key: str) -> None:
    Lease.objects.filter(key=key, holder=current_holder()).delete()
