"""How two email addresses are compared: one owner for it, so the rate limits, the sign-in
links and the team invitations agree on what is the same mailbox."""

from __future__ import annotations

import contextlib
import re

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(address: str) -> str:
    """`address` with its ASCII letters lower-cased, and only those. `str.lower` also maps
    other letters to ASCII ones (U+212A KELVIN SIGN to "k"): a sign-in link mailed to
    "\u212aim@example.com", another mailbox, signed in to kim@example.com's account."""
    return address.translate(_ASCII_LOWER)


def mailbox(address: str) -> str:
    """One spelling of the mailbox an address names, for counting what is sent to it: the
    local part unquoted (`"victim"@…` and `victim@…` are one mailbox, RFC 5321) and the
    domain in its ASCII form (`exämple.com` is `xn--exmple-cua.com`), both with their ASCII
    letters lower-cased (`ascii_lower`). Each spelling had a rate limit of its own, and an
    invitation to one spelling could not be accepted by the account of another."""
    local, _, domain = address.strip().rpartition("@")
    if len(local) >= 2 and local.startswith('"') and local.endswith('"'):
        local = re.sub(r"\\(.)", r"\1", local[1:-1])  # a quoted pair is its character
    with contextlib.suppress(UnicodeError):  # not a domain IDNA takes: counted as written
        domain = domain.encode("idna").decode("ascii")
    return ascii_lower(f"{local}@{domain}")
