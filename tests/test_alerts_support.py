"""Builders and fixtures shared by the alert tests (import them; this module has no tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from alerts.models import Channel, ChannelKind, Subscription, SubscriptionTarget
from registry.models import EventKind, HubModel, ModelEvent, ModelStatus, Verdict
from tests.webhook_receiver import WebhookReceiver

SHA_OLD = "a" * 64
SHA_NEW = "b" * 64


def make_user(name: str, password: str | None = None) -> Any:
    """A user with an unusable password unless given one (hashing costs half a second)."""
    return get_user_model().objects.create_user(
        username=name, email=f"{name}@example.com", password=password
    )


def make_model(repo_id: str, verdict: str = Verdict.SAFE) -> HubModel:
    return HubModel.objects.create(
        repo_id=repo_id, author=repo_id.split("/")[0], status=ModelStatus.OK, verdict=verdict
    )


def make_event(model: HubModel, kind: str = EventKind.TEMPLATE_CHANGED, **data: Any) -> ModelEvent:
    if kind == EventKind.TEMPLATE_CHANGED and not data:
        data = {"old_sha256": SHA_OLD, "new_sha256": SHA_NEW, "commit": "c" * 40}
    return ModelEvent.objects.create(
        model=model,
        kind=kind,
        key=f"{kind}:{model.pk}:{ModelEvent.objects.count()}",
        summary=f"{model.repo_id}: {EventKind(kind).label.lower()}",
        data=data,
    )


def make_channel(
    owner: Any, kind: str = ChannelKind.WEBHOOK, target: str = "", **kw: Any
) -> Channel:
    fields = {"address": target} if kind == ChannelKind.EMAIL else {"url": target}
    kw.setdefault("confirmed_at", timezone.now())
    return Channel.objects.create(owner=owner, kind=kind, **fields, **kw)


def subscribe(channel: Channel, *, model: HubModel | None = None, author: str = "",
              rule: str = "", **flags: bool) -> Subscription:  # fmt: skip
    target = (
        SubscriptionTarget.MODEL if model else
        SubscriptionTarget.AUTHOR if author else SubscriptionTarget.RULE
    )  # fmt: skip
    user: Any = channel.owner or channel.team.members.first()  # type: ignore[union-attr]
    return Subscription.objects.create(
        user=user, channel=channel, target=target, model=model, author=author, rule=rule, **flags
    )


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """A webhook receiver on 127.0.0.1 (the secret is set by the test)."""
    server = WebhookReceiver().start()
    yield server
    server.stop()


@pytest.fixture
def loopback(settings: Any) -> Any:
    """Allow the outbound client to reach 127.0.0.1: only for tests posting to a local receiver."""
    settings.ALERTS_ALLOW_LOOPBACK = True
    return settings


@pytest.fixture
def own_cache(settings: Any) -> Any:
    """A private in-memory cache, so rate-limit counters start at zero."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"alerts-test-{id(settings)}",
        }
    }
    return settings
