"""What an alert says, before any channel formats it: one `EventLine` per event.

Every string here may come from the Hub (repo ids, commit titles, summaries): the email
templates autoescape, and each webhook format escapes for its own markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from registry.models import EventKind, HubModel, ModelEvent, Verdict

#: A digest lists at most this many events (the rest are counted, and on the site).
DIGEST_MAX_EVENTS = 100


def absolute(path: str) -> str:
    return f"{settings.SITE_URL}{path}"


def model_path(repo_id: str) -> str:
    org, _, name = repo_id.partition("/")
    try:
        return reverse("dashboard:model", args=[org, name])
    except NoReverseMatch:
        return f"/m/{quote(repo_id)}/"


def model_url(repo_id: str) -> str:
    return absolute(model_path(repo_id))


def diff_url(repo_id: str, old_sha256: str, new_sha256: str) -> str | None:
    try:
        path = reverse("dashboard:version_diff", args=[new_sha256, old_sha256])
    except NoReverseMatch:
        return None
    return absolute(f"{path}?{urlencode({'model': repo_id})}")


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True)
class EventLine:
    """One event as every channel shows it."""

    event_id: int
    kind: str
    kind_label: str
    repo_id: str
    author: str
    summary: str
    old: str | None
    new: str | None
    verdict: str
    verdict_label: str
    verdict_summary: str
    model_url: str
    diff_url: str | None
    created_at: datetime

    @classmethod
    def of(cls, event: ModelEvent) -> EventLine:
        model: HubModel = event.model
        data = event.data if isinstance(event.data, dict) else {}
        if event.kind == EventKind.TEMPLATE_CHANGED:
            old, new = _text(data.get("old_sha256")), _text(data.get("new_sha256"))
        else:
            old, new = _text(data.get("old")), _text(data.get("new"))
        diff = (
            diff_url(model.repo_id, old, new)
            if event.kind == EventKind.TEMPLATE_CHANGED and old and new
            else None
        )
        return cls(
            event_id=event.pk,
            kind=event.kind,
            kind_label=EventKind(event.kind).label
            if event.kind in EventKind.values
            else event.kind,
            repo_id=model.repo_id,
            author=model.author,
            summary=event.summary,
            old=old,
            new=new,
            verdict=model.verdict,
            verdict_label=Verdict(model.verdict).label if model.verdict in Verdict.values else "",
            verdict_summary=model.verdict_summary,
            model_url=model_url(model.repo_id),
            diff_url=diff,
            created_at=event.created_at,
        )

    def as_json(self) -> dict[str, Any]:
        """The `event` object of the webhook schema (docs/alerts.md)."""
        return {
            "id": self.event_id,
            "kind": self.kind,
            "summary": self.summary,
            "old": self.old,
            "new": self.new,
            "created_at": self.created_at.isoformat(),
            "model": {
                "repo_id": self.repo_id,
                "author": self.author,
                "verdict": self.verdict,
                "verdict_summary": self.verdict_summary,
                "url": self.model_url,
            },
            "links": {"model": self.model_url, "diff": self.diff_url},
        }


@dataclass(frozen=True)
class Notification:
    """One message to one channel: an alert (one event), a digest (many) or a test."""

    type: str  # "alert", "digest", "test"
    key: str  # the idempotency key receivers dedupe on
    events: list[EventLine]
    more: int = 0  # digest events beyond DIGEST_MAX_EVENTS
    created_at: datetime = field(default_factory=timezone.now)

    @property
    def subject(self) -> str:
        if self.type == "digest":
            count = len(self.events) + self.more
            return f"CacheSafe daily digest: {count} change{'s' if count != 1 else ''}"
        prefix = "[test] " if self.type == "test" else ""
        return f"{prefix}CacheSafe: {self.events[0].summary}"[:200]


def sample_event_line() -> EventLine:
    """What a test send shows: a made-up template change of a made-up model."""
    repo_id = "example-org/example-model"
    return EventLine(
        event_id=0,
        kind=EventKind.TEMPLATE_CHANGED,
        kind_label=EventKind.TEMPLATE_CHANGED.label,
        repo_id=repo_id,
        author="example-org",
        summary=f"{repo_id}: chat template changed (test message from CacheSafe)",
        old="0" * 64,
        new="1" * 64,
        verdict=Verdict.SAFE,
        verdict_label=Verdict.SAFE.label,
        verdict_summary="This is a test: no model changed.",
        model_url=absolute("/"),
        diff_url=None,
        created_at=timezone.now(),
    )
