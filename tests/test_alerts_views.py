"""Alert pages: nobody reads or changes another person's alerts; CSRF and rate limits hold."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core import mail
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from alerts.models import Channel, ChannelKind, Subscription, Team
from tests.test_alerts_delivery import channels_alerted
from tests.test_alerts_support import (
    make_channel,
    make_event,
    make_model,
    make_user,
    own_cache,
    subscribe,
)
from tests.test_alerts_teams import join_link

pytestmark = pytest.mark.django_db
__all__ = ["own_cache"]


@pytest.fixture
def alice_and_bob() -> tuple[Any, Any, Channel, Subscription]:
    alice, bob = make_user("alice"), make_user("bob")
    channel = make_channel(alice, target="https://hooks.example.com/alice")
    sub = subscribe(channel, model=make_model("org/m"))
    return alice, bob, channel, sub


def test_the_settings_page_needs_a_sign_in(client: Client) -> None:
    response = client.get(reverse("alerts:settings"))
    assert response.status_code == 302
    assert response.headers["Location"].startswith(reverse("alerts:login"))


def test_the_owner_sees_their_channel_and_history(
    client: Client, alice_and_bob: tuple[Any, Any, Channel, Subscription]
) -> None:
    alice, _, channel, _ = alice_and_bob
    Channel.objects.filter(pk=channel.pk).update(last_error="HTTP 500: upstream down")
    client.force_login(alice)
    page = client.get(reverse("alerts:settings")).content.decode()
    assert "org/m" in page and "hooks.example.com" in page
    assert "HTTP 500: upstream down" in page
    assert "/m/org/m/changes.atom" in page  # the dashboard's feed of the same changes
    assert "/alice" not in page  # a webhook path is a secret: only the host is shown
    detail = client.get(reverse("alerts:channel", args=[channel.pk]))
    assert detail.status_code == 200
    assert channel.secret in detail.content.decode()


def test_every_field_of_the_settings_page_has_an_id_of_its_own(
    client: Client, alice_and_bob: tuple[Any, Any, Channel, Subscription]
) -> None:
    """Several forms share the page: a label must point at its own field (the channel's name
    and the team's name are both `name`)."""
    alice, *_ = alice_and_bob
    client.force_login(alice)
    page = client.get(reverse("alerts:settings")).content.decode()
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    labels = re.findall(r'<label[^>]*\sfor="([^"]+)"[^>]*>([^<]*)', page)
    assert ("id_team_name", "Team name") in [(f, text.strip().rstrip(":")) for f, text in labels]
    assert all(target in ids for target, _ in labels)


@pytest.mark.parametrize(
    ("method", "name", "what"),
    [
        ("get", "alerts:channel", "channel"),
        ("post", "alerts:channel_test", "channel"),
        ("post", "alerts:channel_delete", "channel"),
        ("post", "alerts:channel_resend_confirmation", "channel"),
        ("post", "alerts:subscription_delete", "sub"),
    ],
)
def test_another_user_gets_404_for_someone_elses_channel_or_subscription(
    client: Client,
    alice_and_bob: tuple[Any, Any, Channel, Subscription],
    own_cache: Any,
    method: str,
    name: str,
    what: str,
) -> None:
    _, bob, channel, sub = alice_and_bob
    client.force_login(bob)
    pk = channel.pk if what == "channel" else sub.pk
    response = getattr(client, method)(reverse(name, args=[pk]))
    assert response.status_code == 404
    assert Channel.objects.filter(pk=channel.pk).exists()
    assert Subscription.objects.filter(pk=sub.pk).exists()
    page = client.get(reverse("alerts:settings")).content.decode()
    assert "hooks.example.com" not in page and "org/m" not in page


def test_nobody_can_subscribe_through_someone_elses_channel(
    client: Client, alice_and_bob: tuple[Any, Any, Channel, Subscription], own_cache: Any
) -> None:
    _, bob, channel, _ = alice_and_bob
    client.force_login(bob)
    response = client.post(
        reverse("alerts:subscription_create"),
        {"target": "author", "author": "org", "channel": channel.pk, "on_template": "on"},
    )
    assert response.status_code == 400
    assert not Subscription.objects.filter(user=bob).exists()


def test_the_owner_deletes_their_subscription(
    client: Client, alice_and_bob: tuple[Any, Any, Channel, Subscription]
) -> None:
    alice, _, _, sub = alice_and_bob
    client.force_login(alice)
    assert client.post(reverse("alerts:subscription_delete", args=[sub.pk])).status_code == 302
    assert not Subscription.objects.filter(pk=sub.pk).exists()


def test_a_team_shares_its_webhook_channel(client: Client, own_cache: Any) -> None:
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    client.force_login(alice)
    client.post(reverse("alerts:team_create"), {"name": "Serving"})
    team = Team.objects.get()
    client.post(reverse("alerts:team_add_member", args=[team.pk]), {"email": "bob@example.com"})
    assert not team.members.filter(pk=bob.pk).exists()  # invited: bob has not accepted yet
    client.post(
        reverse("alerts:channel_create"),
        {"kind": "slack", "url": "https://hooks.slack.com/services/T/B/X", "team": team.pk},
    )
    channel = Channel.objects.get()
    assert channel.team == team and channel.owner is None and channel.is_active

    make_model("org/m")
    client.force_login(bob)
    client.post(join_link(mail.outbox[-1]))  # bob accepts
    assert team.members.filter(pk=bob.pk).exists()
    response = client.post(
        reverse("alerts:subscription_create"),
        {"target": "model", "repo_id": "org/m", "channel": channel.pk, "on_verdict": "on"},
    )
    assert response.status_code == 302
    assert Subscription.objects.get(user=bob).channel == channel
    client.force_login(carol)  # not a member
    assert client.get(reverse("alerts:channel", args=[channel.pk])).status_code == 404
    assert (
        client.post(reverse("alerts:team_add_member", args=[team.pk]), {"email": "c@x.org"})
    ).status_code == 404


def test_subscribing_needs_a_tracked_model(client: Client, own_cache: Any) -> None:
    alice = make_user("alice")
    channel = make_channel(alice, target="https://hooks.example.com/a")
    client.force_login(alice)
    response = client.post(
        reverse("alerts:subscription_create"),
        {"target": "model", "repo_id": "org/unknown", "channel": channel.pk, "on_template": "on"},
    )
    assert response.status_code == 400
    assert "not tracked yet" in response.content.decode()


def test_forms_without_a_csrf_token_are_refused(
    alice_and_bob: tuple[Any, Any, Channel, Subscription],
) -> None:
    alice, _, _, sub = alice_and_bob
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse("alerts:subscription_delete", args=[sub.pk])).status_code == 403
    assert Subscription.objects.filter(pk=sub.pk).exists()


def test_subscribing_is_rate_limited(
    client: Client, own_cache: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alerts import throttles

    monkeypatch.setitem(throttles.LIMITS, "subscribe", (3, 3600))
    alice = make_user("alice")
    channel = make_channel(alice, target="https://hooks.example.com/a")
    client.force_login(alice)
    codes = [
        client.post(
            reverse("alerts:subscription_create"),
            {"target": "author", "author": f"org{i}", "channel": channel.pk, "on_template": "on"},
        ).status_code
        for i in range(5)
    ]
    assert codes == [302, 302, 302, 429, 429]
    assert Subscription.objects.count() == 3


def test_test_sends_are_rate_limited_per_user_and_address(
    client: Client, own_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[int] = []
    monkeypatch.setattr("alerts.views.delivery.enqueue", lambda task, pk: sent.append(pk))
    alice = make_user("alice")
    channel = make_channel(alice, target="https://hooks.example.com/a")
    client.force_login(alice)
    url = reverse("alerts:channel_test", args=[channel.pk])
    codes = [client.post(url).status_code for _ in range(7)]
    assert codes == [302] * 5 + [429] * 2
    assert sent == [channel.pk] * 5
    # A test send is no delivery row: the page says where its outcome shows.
    page = client.get(reverse("alerts:channel", args=[channel.pk])).content.decode()
    assert "its result shows here as &quot;Last success&quot; or &quot;Last error&quot;" in page
    assert "Last success" in page and "Last error" in page


def test_the_settings_page_costs_the_same_queries_for_many_rows(client: Client) -> None:
    alice = make_user("alice")
    client.force_login(alice)
    team = Team.objects.create(name="t")
    team.members.add(alice)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("alerts:settings")).status_code == 200
        return len(captured)

    make_channel(alice, target="https://a.example/0")
    subscribe(Channel.objects.get(), model=make_model("org/m0"))
    one = queries()
    for i in range(1, 6):
        channel = make_channel(alice, ChannelKind.EMAIL, f"a{i}@example.com")
        subscribe(channel, model=make_model(f"org/m{i}"))
        make_event(make_model(f"x/m{i}"))
    many = queries()
    assert many == one, f"{one} queries for one row, {many} for six"


def test_the_subscribe_form_is_prefilled_from_a_model_page_link(client: Client) -> None:
    alice = make_user("alice")
    make_channel(alice, target="https://a.example/0")
    client.force_login(alice)
    page = client.get(reverse("alerts:settings") + "?repo_id=Qwen/Qwen3-0.6B").content.decode()
    assert 'value="Qwen/Qwen3-0.6B"' in page


def test_a_member_leaves_a_team_and_loses_its_channels(client: Client) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    team = Team.objects.create(name="Serving")
    team.members.add(alice, bob)
    channel = Channel.objects.create(team=team, kind=ChannelKind.WEBHOOK, url="https://a.example/")
    client.force_login(bob)
    assert client.get(reverse("alerts:channel", args=[channel.pk])).status_code == 200
    assert client.post(reverse("alerts:team_leave", args=[team.pk])).status_code == 302
    assert client.get(reverse("alerts:channel", args=[channel.pk])).status_code == 404
    assert list(team.members.all()) == [alice]


def test_an_account_made_by_a_link_can_set_a_password(client: Client) -> None:
    carol = make_user("carol")  # no usable password, as after a sign-in link
    client.force_login(carol)
    response = client.post(
        reverse("alerts:password"),
        {"new_password1": "correct horse battery 9", "new_password2": "correct horse battery 9"},
    )
    assert response.status_code == 302
    carol.refresh_from_db()
    assert carol.check_password("correct horse battery 9")


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.7/hook", "http://localhost/"]
)
def test_a_webhook_to_a_private_address_is_refused_when_added(client: Client, url: str) -> None:
    client.force_login(make_user("alice"))
    response = client.post(reverse("alerts:channel_create"), {"kind": "webhook", "url": url})
    assert response.status_code == 400
    assert "Webhooks cannot go to a" in response.content.decode()
    assert not Channel.objects.exists()


def test_a_member_who_leaves_a_team_stops_sending_what_they_follow_to_it(
    client: Client,
) -> None:
    """Their subscriptions on the team's channels go with them; and a subscription left on a
    channel its subscriber may no longer use (written before this) reaches no one."""
    alice, bob = make_user("alice"), make_user("bob")
    team = Team.objects.create(name="Serving")
    team.members.add(alice, bob)
    channel = Channel.objects.create(
        team=team, kind=ChannelKind.WEBHOOK, url="https://a.example/", confirmed_at=timezone.now()
    )
    model = make_model("org/m")
    Subscription.objects.create(
        user=alice, channel=channel, target="model", model=model, on_template=True
    )
    client.force_login(alice)
    assert client.post(reverse("alerts:team_leave", args=[team.pk])).status_code == 302
    assert not Subscription.objects.filter(user=alice).exists()
    # As the team's channels were left before: the event reaches no one through it.
    Subscription.objects.create(
        user=alice, channel=channel, target="model", model=model, on_template=True
    )
    assert channels_alerted(make_event(model)) == set()
    bobs = Subscription.objects.create(
        user=bob, channel=channel, target="model", model=model, on_template=True
    )
    assert channels_alerted(make_event(model)) == {bobs.channel_id}


def test_a_subscription_defaults_to_the_readers_own_channel_not_a_teams(client: Client) -> None:
    """Anyone in a team can add a channel to it: a subscribe form that picked the newest
    channel the reader can use sent what they follow to someone else's address."""
    alice, bob = make_user("alice"), make_user("bob")
    own = make_channel(alice, target="https://alice.example/hook")
    team = Team.objects.create(name="Bob's")
    team.members.add(alice, bob)
    Channel.objects.create(
        team=team, kind=ChannelKind.WEBHOOK, url="https://bob.example/", confirmed_at=timezone.now()
    )
    make_model("Qwen/Qwen3-0.6B")
    client.force_login(alice)
    page = client.get(reverse("alerts:settings"), {"repo_id": "Qwen/Qwen3-0.6B"}).content.decode()
    [selected] = re.findall(r'<option value="(\d+)"[^>]*selected', page)
    assert int(selected) == own.pk
