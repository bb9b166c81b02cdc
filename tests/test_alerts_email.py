"""Email alerts: text and HTML parts, one-click unsubscribe, confirmation, bounces, sign-in."""

from __future__ import annotations

import base64
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from alerts import delivery, throttles, tokens
from alerts.models import Channel, ChannelKind, Delivery
from registry.models import ModelEvent, Verdict
from tests.test_alerts_support import (
    SHA_NEW,
    SHA_OLD,
    make_channel,
    make_event,
    make_model,
    make_user,
    own_cache,
    subscribe,
)

pytestmark = pytest.mark.django_db
__all__ = ["own_cache"]


def link_in(message: Any) -> str:
    match = re.search(r"https?://\S+/alerts/\S+/", message.body)
    assert match, message.body
    return match.group(0).split("127.0.0.1:8000", 1)[-1]


def email_alert(mailoutbox: list[Any], summary: str = "") -> tuple[Channel, Any]:
    alice = make_user("alice")
    model = make_model("org/m", verdict=Verdict.UNSAFE)
    channel = make_channel(alice, ChannelKind.EMAIL, "alice@example.com")
    subscribe(channel, model=model)
    event = make_event(model)
    if summary:
        ModelEvent.objects.filter(pk=event.pk).update(summary=summary)
    delivery.claim_event(event.pk)
    assert delivery.deliver(Delivery.objects.get().pk).status == "sent"
    [message] = mailoutbox
    return channel, message


def test_an_alert_mail_has_text_and_html_parts_with_the_change_and_links(
    mailoutbox: list[Any],
) -> None:
    _, message = email_alert(mailoutbox)
    assert message.to == ["alice@example.com"]
    assert message.subject == "CacheSafe: org/m: template changed"
    assert "Template changed: org/m" in message.body
    assert f"{SHA_OLD[:12]} → {SHA_NEW[:12]}" in message.body
    assert "Verdict now: Breaks the cache" in message.body
    assert f"/t/{SHA_NEW}/vs/{SHA_OLD}/" in message.body
    [(html, mimetype)] = message.alternatives
    assert mimetype == "text/html"
    assert '<a href="http://127.0.0.1:8000/m/org/m/">org/m</a>' in html
    assert "<strong>Breaks the cache</strong>" in html


def test_hub_text_is_escaped_in_the_html_part(mailoutbox: list[Any]) -> None:
    _, message = email_alert(mailoutbox, summary="org/m: <img src=x onerror=alert(1)>")
    [(html, _)] = message.alternatives
    assert "<img" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_one_click_unsubscribe_headers_and_the_link_needs_a_post(
    mailoutbox: list[Any], client: Client
) -> None:
    channel, message = email_alert(mailoutbox)
    assert message.extra_headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = message.extra_headers["List-Unsubscribe"].strip("<>")
    assert url in message.body
    path = url.removeprefix("http://127.0.0.1:8000")
    payload = path.rstrip("/").rsplit("/", 1)[-1].split(":")[0]
    assert b"alice" not in base64.urlsafe_b64decode(payload + "==")  # no address in URLs/logs

    page = client.get(path)  # what a mail scanner does
    assert page.status_code == 200
    assert b'method="post"' in page.content
    channel.refresh_from_db()
    assert channel.disabled_at is None

    # RFC 8058: the mail provider POSTs without a session or CSRF cookie.
    one_click = Client(enforce_csrf_checks=True).post(path, {"List-Unsubscribe": "One-Click"})
    assert one_click.status_code == 200
    channel.refresh_from_db()
    assert channel.disabled_at is not None
    assert "unsubscribed" in channel.disabled_reason


def test_a_forged_or_expired_unsubscribe_link_does_nothing(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = make_channel(make_user("alice"), ChannelKind.EMAIL, "alice@example.com")
    token = tokens.unsubscribe_token(channel)
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert client.post(reverse("alerts:unsubscribe", args=[forged])).status_code == 400
    # A confirm token is not an unsubscribe token (each purpose is salted apart).
    confirm = tokens.confirm_token(channel)
    assert client.post(reverse("alerts:unsubscribe", args=[confirm])).status_code == 400
    monkeypatch.setattr(tokens, "UNSUBSCRIBE_MAX_AGE", timedelta(seconds=-1))  # expired
    assert client.post(reverse("alerts:unsubscribe", args=[token])).status_code == 400
    channel.refresh_from_db()
    assert channel.disabled_at is None


def test_an_email_channel_is_confirmed_by_the_link_with_a_post(
    client: Client, own_cache: Any, mailoutbox: list[Any]
) -> None:
    alice = make_user("alice")
    client.force_login(alice)
    response = client.post(
        reverse("alerts:channel_create"), {"kind": "email", "address": "Alice@Example.com"}
    )
    assert response.status_code == 302
    channel = Channel.objects.get()
    assert channel.confirmed_at is None
    [message] = mailoutbox
    assert message.subject == "Confirm your address for CacheSafe alerts"
    assert message.alternatives[0][1] == "text/html"
    path = link_in(message)

    anonymous = Client()
    assert anonymous.get(path).status_code == 200
    channel.refresh_from_db()
    assert channel.confirmed_at is None  # a GET (a scanner) confirms nothing
    assert anonymous.post(path).status_code == 200
    channel.refresh_from_db()
    assert channel.confirmed_at is not None


def test_confirmation_mails_are_rate_limited(
    client: Client, own_cache: Any, mailoutbox: list[Any]
) -> None:
    client.force_login(make_user("alice"))
    codes = [
        client.post(
            reverse("alerts:channel_create"), {"kind": "email", "address": "victim@example.com"}
        ).status_code
        for _ in range(7)
    ]
    assert codes == [302] * 5 + [429] * 2
    assert len(mailoutbox) == 5


def test_a_bounced_address_disables_its_channels_with_the_reason(client: Client) -> None:
    alice = make_user("alice")
    channel = make_channel(alice, ChannelKind.EMAIL, "alice@example.com")
    call_command("alerts_bounce", "ALICE@example.com", "--reason", "550 mailbox unavailable")
    channel.refresh_from_db()
    assert channel.disabled_reason == "550 mailbox unavailable"
    client.force_login(alice)
    assert b"550 mailbox unavailable" in client.get(reverse("alerts:settings")).content


def test_an_smtp_refusal_disables_the_channel(
    mailoutbox: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import smtplib

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise smtplib.SMTPRecipientsRefused({"alice@example.com": (550, b"no such user")})

    monkeypatch.setattr("django.core.mail.EmailMultiAlternatives.send", refuse)
    alice = make_user("alice")
    model = make_model("org/m")
    channel = make_channel(alice, ChannelKind.EMAIL, "alice@example.com")
    subscribe(channel, model=model)
    delivery.claim_event(make_event(model).pk)
    assert delivery.deliver(Delivery.objects.get().pk).status == "failed"
    channel.refresh_from_db()
    assert "refused alice@example.com" in channel.disabled_reason


def test_a_sign_in_link_works_once_and_creates_the_account(
    client: Client, own_cache: Any, mailoutbox: list[Any]
) -> None:
    response = client.post(reverse("alerts:signin_request"), {"email": "new@example.com"})
    assert response.status_code == 200
    path = link_in(mailoutbox[0])
    assert client.get(path).status_code == 200  # a confirm page; nothing used up yet
    assert client.post(path).status_code == 302
    assert client.get(reverse("alerts:settings")).status_code == 200
    assert Client().post(path).status_code == 400  # used


def test_sign_in_by_password(client: Client) -> None:
    make_user("bob", password="a long enough password 1")
    response = client.post(
        reverse("alerts:login"), {"username": "bob", "password": "a long enough password 1"}
    )
    assert response.status_code == 302
    assert response.headers["Location"] == reverse("alerts:settings")


def test_a_mail_server_failure_is_said_on_the_page_not_a_500(
    client: Client, own_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smtplib

    def down(self: Any, *args: Any, **kwargs: Any) -> None:
        raise smtplib.SMTPServerDisconnected("connection unexpectedly closed")

    monkeypatch.setattr("django.core.mail.EmailMultiAlternatives.send", down)
    response = client.post(reverse("alerts:signin_request"), {"email": "new@example.com"})
    assert response.status_code == 503
    assert "could not be sent" in response.content.decode()


def test_two_long_addresses_with_one_start_are_two_accounts(
    client: Client, own_cache: Any, mailoutbox: list[Any]
) -> None:
    """The account's username was the address cut at 150 characters: the second of two
    addresses with one start answered 500 (the username taken). And an address longer than
    an address can be (254) is refused by the form."""
    for domain in ("one.example.com", "two.example.com"):
        address = "L" * 150 + "@" + domain
        assert client.post(reverse("alerts:signin_request"), {"email": address}).status_code == 200
        assert Client().post(link_in(mailoutbox[-1])).status_code == 302
    accounts = get_user_model().objects.filter(email__istartswith="L" * 150)
    assert sorted(a.email.split("@")[1] for a in accounts) == ["one.example.com", "two.example.com"]
    assert len({a.username for a in accounts}) == 2
    too_long = client.post(reverse("alerts:signin_request"), {"email": "x" * 250 + "@example.com"})
    assert too_long.status_code == 400
    assert len(mailoutbox) == 2


@pytest.mark.parametrize(
    "spellings",
    [
        ["victim@example.com", '"victim"@example.com', "Victim@EXAMPLE.com"],
        ["victim@exämple.com", "victim@xn--exmple-cua.com"],
    ],
)
def test_the_mail_limit_counts_a_mailbox_however_its_address_is_spelled(
    client: Client, own_cache: Any, mailoutbox: list[Any], spellings: list[str]
) -> None:
    """A quoted local part, other letters' case and a domain in Unicode name one mailbox:
    each spelling had five mails an hour of its own (30 in one run)."""
    limit = throttles.LIMITS["signin_mail"][0]
    statuses = [
        client.post(
            reverse("alerts:signin_request"),
            {"email": spellings[number % len(spellings)]},
            REMOTE_ADDR=f"203.0.113.{number + 1}",  # a new client each time
        ).status_code
        for number in range(limit + 2)
    ]
    assert statuses == [200] * limit + [429, 429]
    assert len(mailoutbox) == limit
