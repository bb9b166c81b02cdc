"""Signed, expiring links: confirm an address, unsubscribe, sign in, join a team.

Each purpose has its own salt, so a token made for one can never be used for another. A token
names the address it was made for: when the address changes, the old links stop working.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core import signing

from .addresses import ascii_lower, mailbox
from .models import Channel, ChannelKind

CONFIRM_MAX_AGE = timedelta(days=3)
#: Long enough for an old mail's one-click unsubscribe to keep working.
UNSUBSCRIBE_MAX_AGE = timedelta(days=90)
SIGNIN_MAX_AGE = timedelta(minutes=15)


def _signer(purpose: str) -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=f"cachesafe.alerts.{purpose}")


def _read(purpose: str, token: str, max_age: timedelta) -> Any:
    try:
        return _signer(purpose).unsign_object(token, max_age=max_age)
    except (signing.BadSignature, ValueError):  # SignatureExpired is a BadSignature
        return None


def _address_digest(address: str) -> str:
    # Tokens end up in URLs (and server logs): they carry a digest, never the address itself.
    return hashlib.sha256(ascii_lower(address).encode()).hexdigest()[:24]


def _channel_token(purpose: str, channel: Channel) -> str:
    return _signer(purpose).sign_object({"c": channel.pk, "a": _address_digest(channel.address)})


def _channel_from(purpose: str, token: str, max_age: timedelta) -> Channel | None:
    value = _read(purpose, token, max_age)
    if not isinstance(value, dict) or not isinstance(value.get("c"), int):
        return None
    channel = Channel.objects.filter(pk=value["c"], kind=ChannelKind.EMAIL).first()
    if channel is None or _address_digest(channel.address) != value.get("a"):
        return None
    return channel


def confirm_token(channel: Channel) -> str:
    return _channel_token("confirm", channel)


def channel_to_confirm(token: str) -> Channel | None:
    return _channel_from("confirm", token, CONFIRM_MAX_AGE)


def unsubscribe_token(channel: Channel) -> str:
    return _channel_token("unsubscribe", channel)


def channel_to_unsubscribe(token: str) -> Channel | None:
    return _channel_from("unsubscribe", token, UNSUBSCRIBE_MAX_AGE)


def _login_stamp(user: Any) -> str:
    # Signing in changes last_login, which retires every earlier link: single use.
    return user.last_login.isoformat() if user is not None and user.last_login else "-"


def _user_for(email: str) -> Any:
    return get_user_model().objects.filter(email__iexact=email).order_by("pk").first()


def signin_token(email: str) -> str:
    address = ascii_lower(email)
    return _signer("signin").sign_object({"e": address, "s": _login_stamp(_user_for(address))})


def signin_address(token: str) -> str | None:
    """The address of a valid, unused sign-in link, else None (reads, changes nothing)."""
    value = _read("signin", token, SIGNIN_MAX_AGE)
    if not isinstance(value, dict) or not isinstance(value.get("e"), str):
        return None
    if value.get("s") != _login_stamp(_user_for(value["e"])):
        return None
    return str(value["e"])


def user_to_sign_in(token: str) -> Any:
    """The user a valid, unused sign-in link is for (created on first use), else None."""
    email = signin_address(token)
    if email is None:
        return None
    user = _user_for(email)
    if user is None:
        user = get_user_model().objects.create_user(username=username_for(email), email=email)
    return user


def username_for(email: str) -> str:
    """A unique username for a new account with this address: the address when it fits the
    column (150 characters), else its start and a hash of the whole (two long addresses with
    one start made one username, and the second sign-in answered 500)."""
    if len(email) <= 150:
        return email
    return f"{email[:133]}~{hashlib.sha256(email.encode()).hexdigest()[:16]}"


#: An invitation to a team stays open this long.
INVITE_MAX_AGE = timedelta(days=7)


def invite_token(invitation: Any) -> str:
    """The link's token of a `TeamInvitation`: its id, signed (no address in a URL)."""
    return _signer("invite").sign_object({"i": invitation.pk})


def invitation(token: str) -> Any:
    """The `TeamInvitation` a valid link names, if it is still open: not accepted, not older
    than `INVITE_MAX_AGE`, its sender still in the team (a sender who leaves takes the
    invitations they sent along: they are deleted). Else None."""
    from .models import TeamInvitation

    value = _read("invite", token, INVITE_MAX_AGE)
    if not isinstance(value, dict) or type(value.get("i")) is not int:
        return None
    found = (
        TeamInvitation.objects.select_related("team", "invited_by")
        .filter(pk=value["i"], accepted_at__isnull=True)
        .first()
    )
    if found is None or not found.team.members.filter(pk=found.invited_by_id).exists():
        return None
    return found


def is_invited(user: Any, address: str) -> bool:
    """Whether the signed-in `user` owns the mailbox an invitation was sent to, however the
    address was spelled (a quoted local part, other ASCII case, a Unicode domain)."""
    return bool(user.email) and mailbox(user.email) == mailbox(address)
