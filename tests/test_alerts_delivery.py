"""Fan-out and delivery in-process: who gets what, once; signed webhooks; retries; digests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from alerts import delivery, outbound, senders
from alerts.models import ChannelKind, Delivery, Digest, Rule, SendStatus
from alerts.notifications import EventLine, Notification
from registry.models import EventKind, ModelEvent, Verdict
from tests.test_alerts_support import (
    SHA_NEW,
    SHA_OLD,
    loopback,
    make_channel,
    make_event,
    make_model,
    make_user,
    receiver,
    subscribe,
)
from tests.webhook_receiver import WebhookReceiver, verify_signature

pytestmark = pytest.mark.django_db
__all__ = ["loopback", "receiver"]


def channels_alerted(event: ModelEvent) -> set[int]:
    delivery.claim_event(event.pk)
    return set(Delivery.objects.filter(event=event).values_list("channel_id", flat=True))


def test_subscriptions_match_by_model_author_and_rule_and_event_kind() -> None:
    alice = make_user("alice")
    model = make_model("Qwen/Qwen3-0.6B")
    other = make_model("mistralai/Mistral-7B")
    by_model = make_channel(alice, target="https://a.example/1")
    by_author = make_channel(alice, target="https://a.example/2")
    by_rule = make_channel(alice, target="https://a.example/3")
    verdict_only = make_channel(alice, target="https://a.example/4")
    subscribe(by_model, model=model)
    subscribe(by_author, author="qwen")  # organisation names match case-insensitively
    subscribe(by_rule, rule=Rule.TURNS_UNSAFE)
    subscribe(verdict_only, model=model, on_template=False)

    assert channels_alerted(make_event(model)) == {by_model.pk, by_author.pk}
    turned_unsafe = make_event(model, EventKind.VERDICT_CHANGED, old="safe", new="unsafe")
    assert channels_alerted(turned_unsafe) == {
        by_model.pk, by_author.pk, by_rule.pk, verdict_only.pk
    }  # fmt: skip
    assert channels_alerted(make_event(other, EventKind.VERDICT_CHANGED, old="unsafe",
                                       new="safe")) == set()  # fmt: skip
    assert channels_alerted(make_event(other, EventKind.VERDICT_CHANGED, old="safe",
                                       new="unsafe")) == {by_rule.pk}  # fmt: skip


def test_unconfirmed_and_disabled_channels_get_nothing() -> None:
    alice = make_user("alice")
    model = make_model("org/m")
    unconfirmed = make_channel(alice, ChannelKind.EMAIL, "a@example.com", confirmed_at=None)
    disabled = make_channel(alice, target="https://a.example/x", disabled_at=timezone.now())
    subscribe(unconfirmed, model=model)
    subscribe(disabled, model=model)
    assert channels_alerted(make_event(model)) == set()


def test_an_event_is_claimed_once_and_a_channel_gets_one_delivery_however_many_subscriptions(
) -> None:  # fmt: skip
    alice = make_user("alice")
    model = make_model("org/m")
    channel = make_channel(alice, target="https://a.example/x")
    subscribe(channel, model=model)
    subscribe(channel, author="org")
    event = make_event(model)
    assert delivery.claim_event(event.pk) == 1
    assert delivery.claim_event(event.pk) is None  # a duplicate task, or the beat's sweep
    assert delivery.dispatch_events() == 0
    assert Delivery.objects.filter(event=event).count() == 1


def test_events_older_than_the_limit_are_not_alerted(settings: Any) -> None:
    alice = make_user("alice")
    model = make_model("org/m")
    subscribe(make_channel(alice, target="https://a.example/x"), model=model)
    event = make_event(model)
    ModelEvent.objects.filter(pk=event.pk).update(created_at=timezone.now() - timedelta(days=3))
    assert delivery.dispatch_events() == 0  # the sweep looks at recent events only
    assert delivery.claim_event(event.pk) == 0  # a late claim task: claimed, nobody alerted
    assert not Delivery.objects.exists()
    assert ModelEvent.objects.get(pk=event.pk).notify_claimed_at is not None


def test_a_webhook_gets_a_signed_post_once_with_the_documented_schema(
    loopback: Any, receiver: WebhookReceiver
) -> None:
    alice = make_user("alice")
    model = make_model("org/m", verdict=Verdict.UNSAFE)
    channel = make_channel(alice, target=f"{receiver.url}/hook")
    receiver.state.secret = channel.secret
    subscribe(channel, model=model)
    event = make_event(model)
    delivery.claim_event(event.pk)
    sent = Delivery.objects.get()

    assert delivery.deliver(sent.pk).status == "sent"
    assert delivery.deliver(sent.pk).status == "sent already"  # a duplicate task sends nothing
    [got] = receiver.received
    assert got.signed
    assert got.headers["X-CacheSafe-Delivery"] == str(sent.uuid)
    assert got.headers["Content-Type"] == "application/json"
    body = got.json()
    assert body["schema"] == "cachesafe.alert/1"
    assert body["type"] == "alert"
    assert body["delivery_id"] == str(sent.uuid)
    assert body["event"]["kind"] == "template_changed"
    assert body["event"]["old"] == SHA_OLD and body["event"]["new"] == SHA_NEW
    assert body["event"]["model"]["repo_id"] == "org/m"
    assert body["event"]["model"]["verdict"] == "unsafe"
    assert body["event"]["links"]["model"].endswith("/m/org/m/")
    assert f"/t/{SHA_NEW}/vs/{SHA_OLD}/" in body["event"]["links"]["diff"]
    sent.refresh_from_db()
    assert (sent.status, sent.attempts, sent.response_code) == (SendStatus.SENT, 1, 200)
    channel.refresh_from_db()
    assert channel.last_success_at is not None


def test_a_tampered_body_or_an_old_timestamp_fails_verification() -> None:
    body = b'{"type":"alert"}'
    now = 1_800_000_000
    header = senders.sign("s3cret", str(now), body)
    assert verify_signature("s3cret", body, str(now), header, now=now)
    assert not verify_signature("s3cret", body + b" ", str(now), header, now=now)
    assert not verify_signature("other", body, str(now), header, now=now)
    assert not verify_signature("s3cret", body, str(now), header, now=now + 3600)  # a replay


def test_a_server_error_is_retried_with_backoff_then_sent(
    loopback: Any, receiver: WebhookReceiver
) -> None:
    alice = make_user("alice")
    model = make_model("org/m")
    channel = make_channel(alice, target=receiver.url)
    subscribe(channel, model=model)
    delivery.claim_event(make_event(model).pk)
    pending = Delivery.objects.get()
    receiver.state.statuses = [503]

    outcome = delivery.deliver(pending.pk)
    assert outcome.status == "retry" and outcome.retry_in == 30
    pending.refresh_from_db()
    assert (pending.status, pending.attempts, pending.response_code) == ("pending", 1, 503)
    assert pending.next_attempt_at is not None
    assert delivery.deliver(pending.pk).status == "sent"
    pending.refresh_from_db()
    assert (pending.status, pending.attempts) == ("sent", 2)
    assert len(receiver.received) == 2


@pytest.mark.parametrize("status", [404, 410])
def test_a_gone_webhook_disables_the_channel_with_the_reason(
    loopback: Any, receiver: WebhookReceiver, status: int
) -> None:
    alice = make_user("alice")
    model = make_model("org/m")
    channel = make_channel(alice, target=receiver.url)
    subscribe(channel, model=model)
    delivery.claim_event(make_event(model).pk)
    receiver.state.statuses = [status]

    assert delivery.deliver(Delivery.objects.get().pk).status == "failed"
    channel.refresh_from_db()
    assert channel.disabled_at is not None
    assert f"HTTP {status}" in channel.disabled_reason
    assert Delivery.objects.get().status == SendStatus.FAILED
    # Nothing more goes there.
    assert channels_alerted(make_event(model)) == set()


def test_a_webhook_pointing_at_a_private_address_is_disabled_without_any_request() -> None:
    alice = make_user("alice")
    model = make_model("org/m")
    channel = make_channel(alice, target="http://169.254.169.254/latest/meta-data/")
    subscribe(channel, model=model)
    delivery.claim_event(make_event(model).pk)
    assert delivery.deliver(Delivery.objects.get().pk).status == "failed"
    channel.refresh_from_db()
    assert "link-local address: not allowed" in channel.disabled_reason


def test_a_digest_channel_gets_one_message_a_day_with_every_waiting_event(
    loopback: Any, receiver: WebhookReceiver
) -> None:
    alice = make_user("alice")
    channel = make_channel(alice, target=receiver.url, digest=True)
    receiver.state.secret = channel.secret
    subscribe(channel, author="org")
    for name in ("a", "b", "c"):
        delivery.claim_event(make_event(make_model(f"org/{name}")).pk)
    assert set(Delivery.objects.values_list("status", flat=True)) == {SendStatus.DIGEST}

    assert delivery.collect_digests() == 1
    assert delivery.collect_digests() == 0  # a second beat tick the same day
    digest = Digest.objects.get()
    assert delivery.send_digest(digest.pk).status == "sent"
    assert delivery.send_digest(digest.pk).status == "sent already"
    [got] = receiver.received
    assert got.signed
    body = got.json()
    assert body["type"] == "digest"
    assert [e["model"]["repo_id"] for e in body["events"]] == ["org/a", "org/b", "org/c"]
    assert set(Delivery.objects.values_list("status", flat=True)) == {SendStatus.SENT}

    delivery.claim_event(make_event(make_model("org/late")).pk)
    assert delivery.collect_digests() == 0  # today's digest went out: this waits for tomorrow
    assert Delivery.objects.filter(status=SendStatus.DIGEST, digest=None).count() == 1


HOSTILE = "org/m: <!channel> @everyone <script>alert(1)</script> [x](http://evil)"


def hostile_line() -> EventLine:
    model = make_model("org/m", verdict=Verdict.UNSAFE)
    event = make_event(model)
    ModelEvent.objects.filter(pk=event.pk).update(summary=HOSTILE)
    return EventLine.of(ModelEvent.objects.select_related("model").get(pk=event.pk))


def test_slack_payload_has_text_and_blocks_with_verdict_change_and_links() -> None:
    payload = senders.slack_payload(Notification("alert", "k", [hostile_line()]))
    assert set(payload) == {"text", "blocks"}
    header, section, context = payload["blocks"]
    mrkdwn = [payload["text"], section["text"]["text"], *(e["text"] for e in context["elements"])]
    assert not any("<!channel>" in text for text in mrkdwn)  # no mention from Hub text
    assert header["type"] == "header" and header["text"]["type"] == "plain_text"
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    assert "&lt;!channel&gt;" in section["text"]["text"]
    assert f"{SHA_OLD[:12]} → {SHA_NEW[:12]}" in section["text"]["text"]
    verdict, links = context["elements"]
    assert "Breaks the cache" in verdict["text"]
    assert "|Model page>" in links["text"] and "|Diff>" in links["text"]
    assert f"/t/{SHA_NEW}/vs/{SHA_OLD}/" in links["text"]


def test_discord_payload_has_content_and_embeds_and_never_pings() -> None:
    payload = senders.discord_payload(Notification("alert", "k", [hostile_line()]))
    assert payload["allowed_mentions"] == {"parse": []}
    [embed] = payload["embeds"]
    assert embed["url"].endswith("/m/org/m/")
    assert embed["color"] == senders.VERDICT_COLOURS["unsafe"]
    assert {f["name"] for f in embed["fields"]} == {"Verdict", "Change", "Diff"}
    assert "\\[x\\]\\(http://evil\\)" in embed["description"]  # no markdown link from the Hub
    assert isinstance(payload["content"], str) and payload["content"]


def test_a_new_event_enqueues_its_claim_after_commit(
    monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    from registry.jobs import task_named

    claimed: list[int] = []
    # The task the outbox sends by name: `alerts.tasks.claim_event` is a proxy for the app of
    # the moment, which an earlier test can leave as another app than the outbox's.
    monkeypatch.setattr(
        task_named("alerts.claim_event"),
        "apply_async",
        lambda args, kwargs, **o: claimed.append(*args),
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        event = make_event(make_model("org/m"))
        assert claimed == []  # nothing leaves before the event is committed
    for callback in callbacks:
        callback()
    assert claimed == [event.pk]


def test_the_sweeper_resends_lost_sends_but_not_those_waiting_for_a_retry(
    monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    from alerts import tasks as notify

    resent: list[int] = []
    monkeypatch.setattr(
        notify.send_delivery, "apply_async", lambda args, kwargs, **o: resent.append(*args)
    )
    alice = make_user("alice")
    channel = make_channel(alice, target="https://a.example/x")
    long_ago = timezone.now() - timedelta(minutes=10)
    lost, backing_off, _fresh = (
        Delivery.objects.create(event=make_event(make_model(f"org/{n}")), channel=channel)
        for n in ("lost", "backoff", "fresh")
    )
    Delivery.objects.filter(pk__in=[lost.pk, backing_off.pk]).update(created_at=long_ago)
    Delivery.objects.filter(pk=backing_off.pk).update(
        next_attempt_at=timezone.now() + timedelta(minutes=30)
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert delivery.resend_stalled() == 1
        assert delivery.resend_stalled() == 0  # the next sweep gives the resent task time
    assert resent == [lost.pk]


def test_beat_entries_name_real_notify_tasks() -> None:
    from workers.celery import app
    from workers.schedule import DEFAULT_SCHEDULE

    jobs = [job for job in DEFAULT_SCHEDULE if job.task.startswith("alerts.")]
    assert {job.task for job in jobs} == {"alerts.dispatch_events", "alerts.send_due_digests"}
    names = [job.task for job in jobs]
    names += [f"alerts.{n}" for n in ("claim_event", "send_delivery", "send_digest", "send_test")]
    for name in names:
        assert name in app.tasks
        assert app.amqp.router.route({}, name)["queue"].name == "notify"


def test_a_test_send_posts_a_sample_and_shows_its_result_on_the_channel(
    loopback: Any, receiver: WebhookReceiver
) -> None:
    channel = make_channel(make_user("alice"), target=receiver.url)
    receiver.state.secret = channel.secret
    assert delivery.send_test(channel.pk).status == "sent"
    [got] = receiver.received
    assert got.signed and got.json()["type"] == "test"
    channel.refresh_from_db()
    assert channel.last_success_at is not None

    receiver.state.statuses = [404]
    assert delivery.send_test(channel.pk).status == "failed"
    channel.refresh_from_db()
    assert channel.last_error.startswith("test: the webhook is gone (HTTP 404")
    assert channel.disabled_at is None  # a test never disables: the owner is looking at it


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120", 120.0), ("²", None), ("1" * 5000, float(senders.RETRY_AFTER_MAX)), ("soon", None)],
)
def test_retry_after_is_read_as_seconds_or_not_at_all(value: str, seconds: float | None) -> None:
    """ "²" is a digit to `str.isdigit`, and 5,000 digits are past what `int` reads: neither
    may fail the send's record."""
    answer = outbound.Response(503, {"retry-after": value}, b"", "https://hooks.example/x")
    assert senders._retry_after(answer) == seconds


def test_a_send_failing_as_no_sender_expects_is_recorded_and_retried_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unrecorded, the send stayed pending and the sweeper sent it again for ever (past
    MAX_ATTEMPTS, and the channel never said why)."""
    alice = make_user("alice")
    model = make_model("org/m")
    channel = make_channel(alice, target="https://hooks.example/x")
    subscribe(channel, model=model)
    delivery.claim_event(make_event(model).pk)
    pending = Delivery.objects.get()

    def crash(*args: Any) -> int:
        raise RuntimeError("an answer nothing checks yet")

    monkeypatch.setattr(senders, "send", crash)
    outcomes = [delivery.deliver(pending.pk).status for _ in range(delivery.MAX_ATTEMPTS + 2)]
    assert outcomes[: delivery.MAX_ATTEMPTS - 1] == ["retry"] * (delivery.MAX_ATTEMPTS - 1)
    assert outcomes[delivery.MAX_ATTEMPTS - 1] == "failed"
    pending.refresh_from_db()
    assert (pending.status, pending.attempts) == (SendStatus.FAILED, delivery.MAX_ATTEMPTS)
    assert pending.last_error == "could not send (RuntimeError: an answer nothing checks yet)"
    channel.refresh_from_db()
    assert channel.last_error == pending.last_error
    assert delivery.send_test(channel.pk).status == "failed"
    channel.refresh_from_db()
    assert channel.last_error.startswith("test: could not send (RuntimeError")
