"""Teams: nobody joins one without saying so, and inviting tells nothing about accounts."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from alerts import tokens
from alerts.models import Team
from tests.test_alerts_support import make_user, own_cache

pytestmark = pytest.mark.django_db
__all__ = ["own_cache"]


def team_of(client: Client, user: Any, name: str = "Serving") -> Team:
    client.force_login(user)
    client.post(reverse("alerts:team_create"), {"name": name})
    return Team.objects.get(name=name)


def invite(client: Client, team: Team, address: str) -> Any:
    return client.post(reverse("alerts:team_add_member", args=[team.pk]), {"email": address},
                       follow=True)  # fmt: skip


def join_link(message: Any) -> str:
    found = re.search(r"https?://\S+/alerts/teams/join/\S+/", message.body)
    assert found, message.body
    return "/" + found.group(0).split("/", 3)[3]


def test_an_invitation_is_a_mail_and_joins_nobody_until_accepted(
    client: Client, own_cache: Any
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    team = team_of(client, alice)
    page = invite(client, team, "Bob@Example.com").content.decode()
    assert "Invitation sent to Bob@Example.com" in page
    assert list(team.members.all()) == [alice]  # bob is not in it: he has said nothing yet
    (sent,) = mail.outbox
    assert sent.to == ["Bob@Example.com"] and "Serving" in sent.subject
    assert "alice@example.com" in sent.body  # who asks
    link = join_link(sent)

    client.force_login(bob)
    asked = client.get(link)
    assert asked.status_code == 200 and "Join Serving" in asked.content.decode()
    assert list(team.members.all()) == [alice]  # a mail scanner's GET changes nothing
    joined = client.post(link)
    assert joined.status_code == 302 and joined["Location"] == reverse("alerts:settings")
    assert set(team.members.all()) == {alice, bob}
    assert client.post(link).status_code == 400  # it works once
    assert team.members.count() == 2


def test_the_answer_is_the_same_whether_the_address_has_an_account(
    client: Client, own_cache: Any
) -> None:
    """ "No account has that address" told any signed-in stranger who had an account."""
    alice = make_user("alice")
    make_user("bob")
    team = team_of(client, alice)
    known = invite(client, team, "bob@example.com").content.decode()
    unknown = invite(client, team, "nobody@example.com").content.decode()
    assert "Invitation sent to bob@example.com" in known
    assert "Invitation sent to nobody@example.com" in unknown
    assert "No account has that address" not in known + unknown

    # The same page but for the address itself (and the CSRF tokens, masked anew each time).
    def plain(page: str, name: str) -> str:
        return re.sub(r'value="[A-Za-z0-9]{64}"', "", page.replace(f"{name}@", "x@"))

    assert plain(known, "bob") == plain(unknown, "nobody")
    assert [m.to for m in mail.outbox] == [["bob@example.com"], ["nobody@example.com"]]


def test_only_the_invited_address_can_accept(client: Client, own_cache: Any) -> None:
    alice, carol = make_user("alice"), make_user("carol")
    team = team_of(client, alice)
    invite(client, team, "bob@example.com")
    link = join_link(mail.outbox[0])

    client.logout()
    anonymous = client.get(link)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith(reverse("alerts:login") + "?next=")

    client.force_login(carol)  # signed in, but not as the address invited
    for answer in (client.get(link), client.post(link)):
        assert answer.status_code == 403
        assert "sent to another address" in answer.content.decode()
    assert list(team.members.all()) == [alice]

    # bob signs in for the first time by the emailed link, and joins.
    client.logout()
    client.post(reverse("alerts:signin_request"), {"email": "bob@example.com", "next": link})
    signin = signin_link_in(mail.outbox[-1])
    assert client.post(signin).status_code == 302
    assert client.post(link).status_code == 302
    assert team.members.filter(email="bob@example.com").exists()


def signin_link_in(message: Any) -> str:
    found = re.search(r"https?://\S+/alerts/login/link/\S+", message.body)
    assert found, message.body
    return "/" + found.group(0).split("/", 3)[3]


@pytest.mark.parametrize("what", ["forged", "team deleted", "inviter left", "expired"])
def test_an_invitation_that_no_longer_holds_is_a_bad_link(
    client: Client, own_cache: Any, what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob, dave = make_user("alice"), make_user("bob"), make_user("dave")
    team = team_of(client, alice)
    team.members.add(dave)  # (as an accepted invitation does)
    invite(client, team, "bob@example.com")
    link = join_link(mail.outbox[0])
    if what == "forged":
        link = link.replace(link.rstrip("/").rsplit(":", 1)[1], "x" * 27)
    elif what == "team deleted":
        team.delete()
    elif what == "inviter left":
        client.post(reverse("alerts:team_leave", args=[team.pk]))
    else:
        monkeypatch.setattr(tokens, "INVITE_MAX_AGE", timedelta(seconds=-1))
    client.force_login(bob)
    for answer in (client.get(link), client.post(link)):
        assert answer.status_code == 400 and "Link not valid" in answer.content.decode()
    assert not Team.objects.filter(members=bob).exists()


def test_invitations_are_rate_limited(client: Client, own_cache: Any) -> None:
    alice = make_user("alice")
    team = team_of(client, alice)
    limit = 10
    answers = [invite(client, team, f"p{n}@example.com").status_code for n in range(limit + 1)]
    assert answers == [200] * limit + [429]
    assert len(mail.outbox) == limit


def test_someone_already_in_the_team_gets_no_mail(client: Client, own_cache: Any) -> None:
    alice = make_user("alice")
    team = team_of(client, alice)
    page = invite(client, team, "ALICE@example.com").content.decode()
    assert "already in Serving" in page and not mail.outbox


def test_a_sign_in_link_for_a_look_alike_address_opens_only_its_own_account(
    client: Client, own_cache: Any
) -> None:
    """U+212A KELVIN SIGN lower-cases to an ASCII "k": a link mailed to "\u212aim@example.com",
    another mailbox, signed in to kim@example.com's account (or made it, to be taken later)."""
    from django.contrib.auth import get_user_model

    kim = get_user_model().objects.create_user(username="kim@example.com", email="kim@example.com")
    look_alike = "\u212aim@example.com"
    client.post(reverse("alerts:signin_request"), {"email": look_alike})
    (sent,) = mail.outbox
    assert client.post(signin_link_in(sent)).status_code == 302
    user: Any = client.get(reverse("alerts:settings")).wsgi_request.user
    assert user.pk != kim.pk and user.email == look_alike
    # The real address still signs in to its own account.
    client.logout()
    client.post(reverse("alerts:signin_request"), {"email": "KIM@example.com"})
    assert client.post(signin_link_in(mail.outbox[-1])).status_code == 302
    assert client.get(reverse("alerts:settings")).wsgi_request.user.pk == kim.pk


def test_password_guesses_are_limited(own_cache: Any) -> None:
    """Every mail a stranger could make us send was limited, password guessing was not."""
    make_user("kim", password="correct horse battery")
    guesser = Client()
    login = reverse("alerts:login")
    codes = [guesser.post(login, {"username": "kim", "password": f"guess{n}"}).status_code
             for n in range(21)]  # fmt: skip
    assert codes == [200] * 20 + [429]
    again = guesser.post(login, {"username": "kim", "password": "correct horse battery"})
    assert again.status_code == 429  # the right one too, for the rest of the hour
    elsewhere = Client(REMOTE_ADDR="203.0.113.9")  # another client, the same account: counted
    assert elsewhere.post(login, {"username": "kim", "password": "x"}).status_code == 429
    someone = Client(REMOTE_ADDR="203.0.113.9")
    assert someone.post(login, {"username": "lee", "password": "x"}).status_code == 200


def test_the_sign_in_page_with_itself_as_next_sends_a_signed_in_reader_on(
    client: Client, own_cache: Any
) -> None:
    client.force_login(make_user("alice"))
    login = reverse("alerts:login")
    answer = client.get(login, {"next": login})
    assert answer.status_code == 302 and answer["Location"] == reverse("alerts:settings")
    assert client.get(login, {"next": "/probes/"})["Location"] == "/probes/"


def test_an_invitation_works_once(client: Client, own_cache: Any) -> None:
    """Accepted, left, then used again: the member was back for the rest of the week."""
    alice, bob = make_user("alice"), make_user("bob")
    team = team_of(client, alice)
    invite(client, team, "bob@example.com")
    link = join_link(mail.outbox[0])
    client.force_login(bob)
    assert client.post(link).status_code == 302
    client.post(reverse("alerts:team_leave", args=[team.pk]))
    assert client.post(link).status_code == 400
    assert client.get(link).status_code == 400
    assert not team.members.filter(pk=bob.pk).exists()


def test_a_sender_back_in_the_team_brings_no_old_invitation_back(
    client: Client, own_cache: Any
) -> None:
    alice, bob, dave = make_user("alice"), make_user("bob"), make_user("dave")
    team = team_of(client, alice)
    team.members.add(dave)
    invite(client, team, "bob@example.com")
    link = join_link(mail.outbox[0])
    client.post(reverse("alerts:team_leave", args=[team.pk]))
    client.force_login(dave)
    invite(client, team, "alice@example.com")
    client.force_login(alice)
    assert client.post(join_link(mail.outbox[-1])).status_code == 302  # alice is back
    client.force_login(bob)
    assert client.post(link).status_code == 400
    assert not team.members.filter(pk=bob.pk).exists()


@pytest.mark.parametrize("spelling", ['"bob"@example.com', "BOB@example.com", "bob@b\u00fccher.de"])
def test_the_invited_mailbox_accepts_however_the_address_was_spelled(
    client: Client, own_cache: Any, spelling: str
) -> None:
    from django.contrib.auth import get_user_model

    alice = make_user("alice")
    email = "bob@xn--bcher-kva.de" if "de" in spelling.rsplit(".", 1)[1] else "bob@example.com"
    bob = get_user_model().objects.create_user(username=email, email=email)
    team = team_of(client, alice)
    invite(client, team, spelling)
    client.force_login(bob)
    assert client.post(join_link(mail.outbox[-1])).status_code == 302
    assert team.members.filter(pk=bob.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_join_racing_the_last_member_leaving_is_a_bad_link(
    own_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The team was deleted between the link's check and the join: a 500 (a foreign key to a
    team that was gone), or on PostgreSQL a membership of nothing."""
    alice, bob = make_user("alice"), make_user("bob")
    theirs = Client()
    team = team_of(theirs, alice)
    invite(theirs, team, "bob@example.com")
    link = join_link(mail.outbox[0])
    checked = tokens.invitation

    def checked_then_left(token: str) -> Any:
        found = checked(token)
        theirs.post(reverse("alerts:team_leave", args=[team.pk]))  # alice's request, meanwhile
        return found

    monkeypatch.setattr(tokens, "invitation", checked_then_left)
    mine = Client(raise_request_exception=False)
    mine.force_login(bob)
    assert mine.post(link).status_code == 400
    assert not Team.objects.exists()
    assert not Team.members.through.objects.exists()


@pytest.mark.parametrize(
    "typed",
    ["l" * 180 + "@example.com", ("l" * 180 + "@example.com").upper()[:-11] + "example.com"],
)
def test_an_account_signs_in_by_password_with_its_address_however_long_or_cased(
    own_cache: Any, typed: str
) -> None:
    """The username of an address past 150 characters is shortened with a hash, which no page
    shows; and a username is matched in its exact case: neither could sign in by password."""
    address = "l" * 180 + "@example.com"
    reader = Client()
    reader.post(reverse("alerts:signin_request"), {"email": address})
    assert reader.post(signin_link_in(mail.outbox[-1])).status_code == 302
    password = "a long enough pass 42"
    answer = reader.post(
        reverse("alerts:password"), {"new_password1": password, "new_password2": password}
    )
    assert answer.status_code == 302
    reader.post(reverse("alerts:logout"))
    signed = reader.post(reverse("alerts:login"), {"username": typed, "password": password})
    assert signed.status_code == 302
    wrong = Client().post(reverse("alerts:login"), {"username": typed, "password": "nope"})
    assert wrong.status_code == 200  # the form again, with its error
