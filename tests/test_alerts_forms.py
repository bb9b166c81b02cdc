"""The alert forms hold the fields of the chosen kind only, and the page a reader came from
(a model's "get alerts" link) survives signing in and adding a first channel."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import reverse

from alerts.models import Channel, ChannelKind, Subscription, Team
from tests.test_alerts_email import link_in
from tests.test_alerts_support import make_channel, make_model, make_user, own_cache

pytestmark = pytest.mark.django_db
__all__ = ["own_cache"]

SETTINGS = reverse("alerts:settings")


def field_names(html: str) -> set[str]:
    return set(re.findall(r'name="([a-z_]+)"', html)) - {"csrfmiddlewaretoken", "next"}


@pytest.mark.parametrize(
    ("kind", "shown", "hidden"),
    [
        ("email", {"kind", "address", "name", "digest"}, {"url"}),
        ("webhook", {"kind", "url", "name", "digest"}, {"address"}),
        ("slack", {"kind", "url", "name", "digest"}, {"address"}),
        ("discord", {"kind", "url", "name", "digest"}, {"address"}),
        ("bogus", {"kind", "address", "name", "digest"}, {"url"}),  # unknown: the default, email
    ],
)
def test_the_channel_form_shows_the_fields_of_its_kind(
    client: Client, kind: str, shown: set[str], hidden: set[str]
) -> None:
    client.force_login(make_user("alice"))
    html = client.get(reverse("alerts:channel_form"), {"kind": kind}).content.decode()
    assert field_names(html) == shown
    assert not hidden & field_names(html)
    assert 'hx-get="/alerts/channels/form"' in html  # changing the kind swaps this form again


def test_the_team_field_appears_only_for_a_member_of_a_team(client: Client) -> None:
    alice = make_user("alice")
    client.force_login(alice)
    assert "team" not in field_names(client.get(reverse("alerts:channel_form")).content.decode())
    Team.objects.create(name="Serving").members.add(alice)
    assert "team" in field_names(client.get(reverse("alerts:channel_form")).content.decode())


def test_a_field_of_another_kind_is_neither_shown_nor_saved(client: Client) -> None:
    client.force_login(make_user("alice"))
    response = client.post(
        reverse("alerts:channel_create"),
        {"kind": "email", "address": "a@example.com", "url": "https://hooks.example.com/x"},
    )
    assert response.status_code == 302
    channel = Channel.objects.get()
    assert (channel.kind, channel.address, channel.url) == (ChannelKind.EMAIL, "a@example.com", "")


def test_a_missing_field_is_said_next_to_it(client: Client) -> None:
    client.force_login(make_user("alice"))
    response = client.post(reverse("alerts:channel_create"), {"kind": "slack"})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'class="field has-error"' in html
    assert "A webhook channel needs its URL." in html
    assert 'name="address"' not in html  # the failed form is the slack form, not the email one


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ("model", {"target", "repo_id", "with_derivatives", "channel", "on_template",
                   "on_verdict", "on_probe", "on_status", "on_base_fixed"}),
        ("author", {"target", "author", "channel", "on_template", "on_verdict", "on_probe",
                    "on_status", "on_base_fixed"}),
        ("rule", {"target", "rule", "channel"}),
    ],
)  # fmt: skip
def test_the_subscribe_form_shows_the_fields_of_its_target(
    client: Client, target: str, shown: set[str]
) -> None:
    client.force_login(make_user("alice"))
    html = client.get(reverse("alerts:subscription_form"), {"target": target}).content.decode()
    assert field_names(html) == shown


def test_a_rule_subscription_needs_no_event_boxes(client: Client) -> None:
    alice = make_user("alice")
    channel = make_channel(alice, target="https://hooks.example.com/a")
    client.force_login(alice)
    response = client.post(
        reverse("alerts:subscription_create"),
        {"target": "rule", "rule": "turns_unsafe", "channel": channel.pk},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    sub = Subscription.objects.get()
    assert (sub.rule, sub.on_verdict, sub.on_template) == ("turns_unsafe", True, False)


def test_subscribing_again_to_the_same_model_on_the_same_channel_updates_it(
    client: Client,
) -> None:
    """Sent twice, the form makes one subscription (one alert per event), with the events
    of the latest send, and says so; another channel is another subscription."""
    alice = make_user("alice")
    make_model("org/m")
    first = make_channel(alice, target="https://hooks.example.com/a")
    client.force_login(alice)
    form = {"target": "model", "repo_id": "org/m", "channel": first.pk, "on_template": "on"}
    client.post(reverse("alerts:subscription_create"), {**form, "on_verdict": "on"})
    again = client.post(reverse("alerts:subscription_create"), form, follow=True)
    assert "Already subscribed: org/m on" in again.content.decode()
    sub = Subscription.objects.get()
    assert (sub.on_template, sub.on_verdict) == (True, False)
    other = make_channel(alice, target="https://hooks.example.com/b")
    client.post(reverse("alerts:subscription_create"), {**form, "channel": other.pk})
    assert Subscription.objects.count() == 2


def test_a_model_link_survives_a_sign_in_by_mail_and_a_first_channel(
    client: Client, own_cache: Any, mailoutbox: list[Any]
) -> None:
    make_model("Qwen/Qwen3-0.6B")
    wanted = SETTINGS + "?repo_id=Qwen%2FQwen3-0.6B"
    login = client.get(SETTINGS + "?repo_id=Qwen/Qwen3-0.6B")
    assert login.status_code == 302
    page = client.get(login.headers["Location"]).content.decode()
    next_value = re.search(r'name="next" value="([^"]+)"', page)
    assert next_value and "repo_id" in next_value.group(1)

    client.post(
        reverse("alerts:signin_request"),
        {"email": "new@example.com", "next": next_value.group(1).replace("&amp;", "&")},
    )
    link = link_in(mailoutbox[0])
    assert "next=" in mailoutbox[0].body
    query = re.search(r"\?next=\S+", mailoutbox[0].body)
    assert query
    signed_in = client.post(link + query.group(0))
    assert signed_in.status_code == 302
    assert signed_in.headers["Location"] == SETTINGS + "?repo_id=Qwen/Qwen3-0.6B"

    # No channel yet: the page says so, and the add-a-channel form brings the reader back here.
    page = client.get(signed_in.headers["Location"]).content.decode()
    assert "To get alerts about Qwen/Qwen3-0.6B, first add a channel" in page
    assert f'name="next" value="{wanted}"' in page
    added = client.post(
        reverse("alerts:channel_create"),
        {"kind": "slack", "url": "https://hooks.slack.com/services/T/B/x", "next": wanted},
    )
    assert added.headers["Location"] == wanted
    page = client.get(wanted).content.decode()
    assert 'name="repo_id"' in page and 'value="Qwen/Qwen3-0.6B"' in page


HOSTILE = ["https://evil.example/", "//evil.example/alerts/", "/\\evil.example", "javascript:x"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_next_page_off_the_site_is_ignored(
    client: Client, own_cache: Any, mailoutbox: list[Any], hostile: str
) -> None:
    client.post(reverse("alerts:signin_request"), {"email": "new@example.com", "next": hostile})
    assert "next=" not in mailoutbox[0].body
    path = link_in(mailoutbox[0])
    signed_in = client.post(f"{path}?next={quote(hostile, safe='')}")
    assert signed_in.headers["Location"] == SETTINGS

    added = client.post(
        reverse("alerts:channel_create"),
        {"kind": "webhook", "url": "https://hooks.example.com/a", "next": hostile},
    )
    assert added.headers["Location"] == reverse("alerts:channel", args=[Channel.objects.get().pk])
