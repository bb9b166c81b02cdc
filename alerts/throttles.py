"""Rate limits on what a stranger can make us do: subscribe, send mail (confirmations, sign-in
links, invitations to a team), send test webhooks, guess passwords.

Counted per client address, per signed-in user and per target address, in the shared cache
(Redis in production) by the registry's fixed-window counter.
"""

from __future__ import annotations

import hashlib

from django.http import HttpRequest

from registry.rate_limits import allow

from .addresses import mailbox

#: action: (requests, window in seconds), for each key separately.
LIMITS: dict[str, tuple[int, int]] = {
    "subscribe": (30, 3600),
    "confirmation_mail": (5, 3600),
    "signin_mail": (5, 3600),
    "test_send": (5, 3600),
    "invite_mail": (10, 3600),
    "password_signin": (20, 3600),
}


def client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is whatever the client says unless a trusted proxy
    # rewrote it, and no proxy is assumed (the same rule as tracking a repo).
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def allowed(action: str, request: HttpRequest, *targets: str) -> bool:
    """True while this address, this user and each target (a mail address) are within limits."""
    limit, window = LIMITS[action]
    keys = [f"ip:{client_address(request)}"]
    if request.user.is_authenticated:
        keys.append(f"user:{request.user.pk}")
    # Hashed: a mail address is no cache key (and no business of whoever reads the cache).
    keys += [f"to:{hashlib.sha256(mailbox(t).encode()).hexdigest()[:24]}" for t in targets]
    # Every key counts the attempt (a list first, so no key is skipped by a short-circuit).
    within = [allow(f"alerts:{action}:{key}", limit, window) for key in keys]
    return all(within)
