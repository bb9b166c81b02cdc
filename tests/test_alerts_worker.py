"""Alerts through a real Celery worker: a kill mid-delivery, and a change upstream end to end."""

from __future__ import annotations

import email
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from alerts.models import ChannelKind, Delivery, SendStatus
from alerts.tasks import claim_event, dispatch_events, send_delivery
from registry.models import HubModel, Lease, ModelEvent
from registry.tasks import sync_repo
from tests.fakehub import FakeHub
from tests.fakehub.corpus import upload_files
from tests.fakehub.fixtures import fake_hub
from tests.test_alerts_support import (
    make_channel,
    make_event,
    make_model,
    make_user,
    receiver,
    subscribe,
)
from tests.webhook_receiver import WebhookReceiver
from tests.workerproc import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]
__all__ = ["fake_hub", "receiver"]

LOOPBACK = {"ALERTS_ALLOW_LOOPBACK": "true"}
CHATML = b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_a_worker_killed_mid_delivery_ends_with_exactly_one_delivery(
    celery_workers: Any, receiver: WebhookReceiver
) -> None:
    alice = make_user("alice")
    model = make_model("org/m")
    channel = make_channel(alice, target=f"{receiver.url}/hook")
    receiver.state.secret = channel.secret
    receiver.state.stall_first = 1  # the first request hangs until the worker is dead
    subscribe(channel, model=model)
    # A long timeout: the kill, not the client's timeout, must end the first attempt.
    celery_workers(queues="notify", extra_env={**LOOPBACK, "ALERTS_HTTP_TIMEOUT": "30"})

    make_event(model)  # the new-event signal enqueues its claim after commit
    assert receiver.state.stalled.wait(60), "the first request never arrived"
    sent = Delivery.objects.get()
    lease = wait_for(lambda: Lease.objects.filter(key=f"delivery:{sent.pk}").first(), 30, "lease")
    os.kill(int(lease.holder.rsplit(":", 1)[1]), signal.SIGKILL)  # the pool process, mid-send
    receiver.state.release.set()

    wait_for(lambda: Delivery.objects.get().status == SendStatus.SENT, 90, "the redelivery")
    sent.refresh_from_db()
    assert sent.attempts == 2
    assert Delivery.objects.count() == 1
    answered = [r for r in receiver.received if r.answered]
    assert len(answered) == 1 and answered[0].signed
    # The killed attempt did reach the receiver (at-least-once): both carry one idempotency key.
    assert [r.headers["X-CacheSafe-Delivery"] for r in receiver.received] == [str(sent.uuid)] * 2
    # Released right after the success is recorded (the finally of the send).
    wait_for(lambda: not Lease.objects.exists(), 10, "the lease to be released")


def test_a_template_change_upstream_alerts_each_subscriber_exactly_once(
    celery_workers: Any, fake_hub: FakeHub, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    repo_id = "org/model"
    fake_hub.store.create_repo(repo_id)
    fake_hub.store.add_commit(
        repo_id, upload_files(repo_id, CHATML, "<s>", "</s>", as_jinja=False), "Upload model"
    )
    model, _ = HubModel.objects.track(repo_id, via="track")
    mail_dir = tmp_path / "mail"
    worker = celery_workers(
        queues="default,hub,notify",
        extra_env={
            **LOOPBACK,
            "HF_ENDPOINT": fake_hub.url,
            "HF_REQUESTS_PER_5MIN": "1000000",
            "EMAIL_FILE_PATH": str(mail_dir),
        },
    )

    def claimed(count: int) -> ModelEvent | None:
        events = ModelEvent.objects.filter(notify_claimed_at__isnull=False).order_by("-id")
        return events.first() if events.count() == count else None

    def sync_and_dispatch(changes: int) -> ModelEvent:
        sync_repo.delay(model.pk)  # its template_changed signal dispatches the change
        wait_for(
            lambda: ModelEvent.objects.count() == changes,
            60,
            f"{changes} event(s) ({worker.log()[-3000:]})",
        )
        dispatch_events.delay()  # what the beat does every few seconds
        event: ModelEvent = wait_for(
            lambda: claimed(changes), 60, f"the event to be claimed ({worker.log()[-3000:]})"
        )
        return event

    sync_and_dispatch(1)  # the first sync: nobody is subscribed yet
    alice, bob, carol, dave = (make_user(n) for n in ("alice", "bob", "carol", "dave"))
    alice_hook = make_channel(alice, target=f"{receiver.url}/alice")
    subscribe(alice_hook, model=HubModel.objects.get(pk=model.pk))
    subscribe(alice_hook, author="ORG")  # two matching subscriptions, one channel: one alert
    subscribe(make_channel(bob, ChannelKind.SLACK, f"{receiver.url}/bob"), author="org")
    subscribe(make_channel(carol, ChannelKind.EMAIL, "carol@example.com"), author="org")
    subscribe(make_channel(dave, target=f"{receiver.url}/dave"), author="org", on_template=False)

    tools = CHATML + b"{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
    fake_hub.store.add_commit(
        repo_id, upload_files(repo_id, tools, "<s>", "</s>", as_jinja=False), "Fix tool calls"
    )
    event = sync_and_dispatch(2)
    wait_for(
        lambda: Delivery.objects.filter(event=event, status=SendStatus.SENT).count() == 3,
        60,
        f"three deliveries (worker log: {worker.log()[-3000:]})",
    )
    # Duplicates of every task, as a redelivery or a second beat tick would send them.
    claim_event.delay(event.pk)
    for pk in Delivery.objects.values_list("pk", flat=True):
        send_delivery.delay(pk)
    wait_for(lambda: worker.log().count("'sent already'") >= 3, 60, "the duplicates to finish")

    paths = sorted(r.path for r in receiver.received)
    assert paths == ["/alice", "/bob"]
    alice_body = next(r for r in receiver.received if r.path == "/alice").json()
    assert alice_body["event"]["model"]["repo_id"] == repo_id
    assert alice_body["event"]["links"]["diff"]
    assert "blocks" in next(r for r in receiver.received if r.path == "/bob").json()
    mails = [email.message_from_bytes(p.read_bytes()) for p in mail_dir.iterdir()]
    assert [m["To"] for m in mails] == ["carol@example.com"]
    assert mails[0]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert Delivery.objects.filter(event=event).count() == 3
