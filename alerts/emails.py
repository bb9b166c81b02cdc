"""The mails alerts send: alerts and digests, address confirmations, sign-in links, invitations
to a team.

Each has a text and an HTML part rendered from `templates/alerts/email/<name>.{txt,html}`;
both autoescape nothing by hand: the HTML template escapes, the text part is plain text.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import reverse

from . import tokens
from .models import Channel, TeamInvitation
from .notifications import Notification, absolute


def _one_line(text: str) -> str:
    # A header never carries a newline from anywhere (Django refuses, and rightly so).
    return " ".join(text.split())[:200]


def compose(
    name: str, subject: str, to: str, context: dict[str, Any], headers: dict[str, str] | None = None
) -> EmailMultiAlternatives:
    context = {**context, "subject": subject, "settings_url": absolute(reverse("alerts:settings"))}
    message = EmailMultiAlternatives(
        subject=_one_line(subject),
        body=render_to_string(f"alerts/email/{name}.txt", context),
        to=[to],
        headers={"Auto-Submitted": "auto-generated", **(headers or {})},
    )
    message.attach_alternative(render_to_string(f"alerts/email/{name}.html", context), "text/html")
    return message


def unsubscribe_url(channel: Channel) -> str:
    return absolute(reverse("alerts:unsubscribe", args=[tokens.unsubscribe_token(channel)]))


def alert_email(channel: Channel, notification: Notification) -> EmailMultiAlternatives:
    """An alert or digest, with one-click unsubscribe headers (RFC 2369, RFC 8058)."""
    unsubscribe = unsubscribe_url(channel)
    return compose(
        "alert",
        notification.subject,
        channel.address,
        {
            "notification": notification,
            "events": notification.events,
            "unsubscribe_url": unsubscribe,
            "feed_url": absolute(reverse("dashboard:feed")),
        },
        headers={
            "List-Unsubscribe": f"<{unsubscribe}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            "X-CacheSafe-Delivery": notification.key,
        },
    )


def confirmation_email(channel: Channel) -> EmailMultiAlternatives:
    link = absolute(reverse("alerts:confirm", args=[tokens.confirm_token(channel)]))
    return compose(
        "confirm",
        "Confirm your address for CacheSafe alerts",
        channel.address,
        {"link": link, "days": tokens.CONFIRM_MAX_AGE.days},
    )


def signin_email(address: str, next_page: str | None = None) -> EmailMultiAlternatives:
    """The one-time link; it brings the reader back to `next_page` (a path of ours) once used."""
    link = absolute(reverse("alerts:signin_link", args=[tokens.signin_token(address)]))
    if next_page:
        link += "?" + urlencode({"next": next_page})
    minutes = int(tokens.SIGNIN_MAX_AGE.total_seconds() // 60)
    return compose(
        "signin", "Your CacheSafe sign-in link", address, {"link": link, "minutes": minutes}
    )


def invite_email(invitation: TeamInvitation) -> EmailMultiAlternatives:
    """An invitation to a team: a link its recipient accepts signed in with its address."""
    link = absolute(reverse("alerts:team_join", args=[tokens.invite_token(invitation)]))
    inviter = invitation.invited_by
    who = inviter.email or inviter.get_username()
    team = invitation.team.name
    return compose(
        "invite",
        f"{who} invites you to {team} on CacheSafe alerts",
        invitation.address,
        {"link": link, "team": team, "inviter": who, "days": tokens.INVITE_MAX_AGE.days},
    )
