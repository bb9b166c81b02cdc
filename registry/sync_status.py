"""A model's sync state in plain words, and whether the Hub is reachable from this server.

The sync writes raw text: `HubModel.sync_error` is a `HubUnavailable` message from `registry.hub`
(``"org/name info: ConnectError: [Errno -2] Name or service not known after 5 attempts"``), and
`status_reason` what `registry.hub.unavailable_status` or a `BrokenRepo` said. Pages must not
show exceptions to people, so `explain_sync_error` and `explain_status` turn those strings into
one sentence each; `describe` combines them with the stored times. All three are pure: they read
only fields already loaded, so a page that shows them costs no query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.db.models import Q
from django.utils import timezone

from .models import HubModel, ModelStatus

#: A sync that succeeded this recently proves the Hub answers. Longer than the 10 minutes
#: between two beat runs of `hub.sync_stalest`, so the banner does not blink on between runs.
REACHABLE_WINDOW = timedelta(minutes=15)

#: httpx exception names that `HubClient._call` writes when no connection could be opened.
CONNECT_ERRORS = ("ConnectError", "ConnectTimeout")
TIMEOUT_ERRORS = ("ReadTimeout", "WriteTimeout", "PoolTimeout", "TimeoutException")
DROPPED_ERRORS = ("ReadError", "WriteError", "CloseError", "RemoteProtocolError", "NetworkError")

RETRY = "we retry automatically"
RECHECK = "we look again on every scheduled sync"


class Problem(StrEnum):
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    DROPPED = "dropped"
    RATE_LIMITED = "rate_limited"
    HUB_ERROR = "hub_error"
    BAD_ANSWER = "bad_answer"
    GATED = "gated"
    PRIVATE = "private"
    MISSING = "missing"
    DISABLED = "disabled"
    BROKEN = "broken"
    NO_TEMPLATE = "no_template"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Explanation:
    """One problem in one sentence; `retrying` says whether it will fix itself."""

    problem: Problem
    sentence: str
    retrying: bool = True
    #: Seconds the Hub asked us to wait, counted from the failure (its time is not stored).
    wait_seconds: float | None = None


# (needle in the lower-cased error, words) for why a connection could not be opened.
_CONNECT_CAUSES = (
    ("name or service not known", "name not resolved"),
    ("temporary failure in name resolution", "name not resolved"),
    ("nodename nor servname", "name not resolved"),
    ("getaddrinfo failed", "name not resolved"),
    ("no address associated", "name not resolved"),
    ("connection refused", "connection refused"),
    ("network is unreachable", "network unreachable"),
    ("no route to host", "no route to host"),
    ("certificate", "TLS certificate rejected"),
    ("ssl", "TLS handshake failed"),
    ("timed out", "connection timed out"),
)
_WAIT = re.compile(r"(?:retry after|retry in|rate limited for) (\d+(?:\.\d+)?)s")
_STATUS = re.compile(r"\b(?:Hub error|Hub answered) (\d{3})\b")
_CODE = re.compile(r"\((\d{3})\)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} seconds"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    hours = round(seconds / 3600)
    return f"{hours} hour{'s' if hours != 1 else ''}"


def _has(text: str, names: tuple[str, ...]) -> bool:
    return any(f"{name}:" in text or text.endswith(name) for name in names)


def explain_sync_error(sync_error: str) -> Explanation | None:
    """Why the last sync attempt failed, in words; None when it did not fail."""
    text = sync_error.strip()
    if not text:
        return None
    lower = text.lower()
    if _has(text, CONNECT_ERRORS):
        cause = "connection timed out" if "ConnectTimeout" in text else ""
        cause = next((words for needle, words in _CONNECT_CAUSES if needle in lower), cause)
        detail = f" ({cause})" if cause else ""
        return Explanation(Problem.UNREACHABLE, f"The Hub could not be reached{detail}; {RETRY}.")
    if "rate limit" in lower or "(429" in text:
        wait = _WAIT.search(text)
        seconds = float(wait.group(1)) if wait else None
        asked = f" and asked us to wait {_duration(seconds)}" if seconds else ""
        return Explanation(
            Problem.RATE_LIMITED,
            f"The Hub is rate-limiting our requests{asked}; {RETRY}.",
            wait_seconds=seconds,
        )
    if _has(text, TIMEOUT_ERRORS):
        return Explanation(Problem.TIMEOUT, f"The Hub did not answer in time; {RETRY}.")
    if _has(text, DROPPED_ERRORS):
        return Explanation(
            Problem.DROPPED, f"The connection to the Hub broke off mid-answer; {RETRY}."
        )
    status = _STATUS.search(text)
    if status:
        code = int(status.group(1))
        kind = "a server error" if code >= 500 else "an error"
        return Explanation(Problem.HUB_ERROR, f"The Hub answered with {kind} ({code}); {RETRY}.")
    if "lists no commits" in lower or "did not answer a list" in lower:
        return Explanation(Problem.BAD_ANSWER, f"The Hub sent an answer we could not use; {RETRY}.")
    return Explanation(Problem.UNKNOWN, f"The last sync did not finish; {RETRY}.")


def explain_status(status: str, reason: str = "") -> Explanation | None:
    """Why a synced repo has no usable template (gated, gone, broken …); None when it has."""
    code = _CODE.search(reason)
    http = f" ({code.group(1)})" if code else ""
    if status == ModelStatus.GATED:
        return Explanation(
            Problem.GATED,
            "This repo is gated on the Hub: its conditions must be accepted with the token "
            f"this server uses before we can read its files; {RECHECK}.",
            retrying=False,
        )
    if status == ModelStatus.PRIVATE:
        return Explanation(
            Problem.PRIVATE,
            f"The Hub refused access{http}: the repo is private or our token cannot read it; "
            f"{RECHECK}.",
            retrying=False,
        )
    if status == ModelStatus.MISSING:
        return Explanation(
            Problem.MISSING,
            f"The Hub has no repo by this name{http}: it was deleted, renamed or made private; "
            f"{RECHECK}.",
            retrying=False,
        )
    if status == ModelStatus.DISABLED:
        return Explanation(
            Problem.DISABLED, f"The Hub has disabled this repo; {RECHECK}.", retrying=False
        )
    if status == ModelStatus.BROKEN:
        why = reason.strip().rstrip(".") or "no reason recorded"
        return Explanation(
            Problem.BROKEN,
            f"The repo's template files cannot be used as they are ({why}); "
            "we read them again when the repo changes.",
            retrying=False,
        )
    if status == ModelStatus.NO_TEMPLATE:
        return Explanation(
            Problem.NO_TEMPLATE,
            "The repo has no chat template at its latest commit; "
            "we check again when the repo changes.",
            retrying=False,
        )
    return None


@dataclass(frozen=True)
class SyncState:
    """What a page says about a model's sync: when, and what went wrong in words."""

    label: str  # a few words for a badge: "Synced", "Sync failing", "Gated" …
    tone: str  # "ok", "pending", "warn" or "error": which colour the label gets
    synced_at: datetime | None
    error: Explanation | None  # the last attempt failed (the stored data may be older)
    status: Explanation | None  # the repo, as last read, has no usable template
    raw_error: str = ""
    from_hub: bool = True
    failed_at: datetime | None = None  # when the failing attempt was made

    @property
    def sentence(self) -> str:
        """The one sentence to show first: a failing sync outranks the stored status."""
        if self.error is not None:
            if self.synced_at is None:
                return f"Not synced yet. {self.error.sentence}"
            return f"Showing what was last synced. {self.error.sentence}"
        if self.status is not None:
            return self.status.sentence
        if self.synced_at is None and self.from_hub:
            return "Not synced yet: the first sync is queued."
        return ""


def describe(model: HubModel) -> SyncState:
    """The sync state of `model` from its stored fields (no query)."""
    from_hub = not model.is_demo and model.tracked_via != "local"
    # Demo and imported models are not read from the Hub: no sync of theirs can fail.
    error = explain_sync_error(model.sync_error) if from_hub else None
    status = explain_status(model.status, model.status_reason)
    if error is not None and model.last_synced_at is None:
        label, tone = "Sync failing", "error"
    elif error is not None:
        label, tone = "Last sync failed", "warn"
    elif status is not None:
        label = str(ModelStatus(model.status).label)
        tone = "error" if status.problem in (Problem.MISSING, Problem.DISABLED) else "warn"
    elif model.last_synced_at is None:
        label, tone = str(ModelStatus.PENDING.label), "pending"
    else:
        label, tone = "Synced", "ok"
    return SyncState(
        label=label,
        tone=tone,
        synced_at=model.last_synced_at,
        error=error,
        status=status,
        raw_error=model.sync_error if error is not None else "",
        from_hub=from_hub,
        failed_at=model.sync_failed_at if error is not None else None,
    )


def connection_failed() -> Q:
    """Models whose last sync attempt could not open a connection to the Hub."""
    q = Q()
    for name in CONNECT_ERRORS:
        q |= Q(sync_error__contains=f"{name}:")
    return q


def hub_unreachable(now: datetime | None = None) -> bool:
    """Is the Hub unreachable from here? One query, and a second when some model's last sync
    could not connect.

    The failure time of a sync is not stored (`record_failure` writes only the message), so
    "recent" is read from the successes instead: some model's last attempt could not connect,
    and no sync of any Hub model succeeded within `REACHABLE_WINDOW`. A success clears a
    model's `sync_error`, so once the Hub answers again the next sync ends the banner.

    The failing models are found first, through the index that holds them alone (registry
    migration 0020): asked as one query, PostgreSQL read the whole table twice for them and
    for a recent success, 110 to 135 ms at 100,000 models, each time a web process refreshed
    its banner (`dashboard.status`, every 30 s)."""
    hub_models = HubModel.objects.filter(is_demo=False).exclude(tracked_via="local")
    if not hub_models.exclude(sync_error="").filter(connection_failed()).exists():
        return False
    cutoff = (now or timezone.now()) - REACHABLE_WINDOW
    return not hub_models.filter(last_synced_at__gte=cutoff, sync_error="").exists()
