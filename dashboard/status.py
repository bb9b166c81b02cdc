"""Sync and check status as the model page shows it, and the site's "Hub unreachable" banner.

The words come from `registry.sync_status`; this module adds what only a page needs: the newest
check's time next to the sync's, and a per-process cache so the banner on every page costs no
query on the request.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from django.db import connections
from django.utils import timezone
from django.utils.timesince import timesince

from registry.models import CheckRun, CheckStatus, HubModel
from registry.sync_status import SyncState, describe, hub_unreachable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelStatusLine:
    """Last synced, last checked, last error: what healthchecks.io shows for a check."""

    sync: SyncState
    checked_at: datetime | None
    checking: bool  # the newest check of the current template has not finished
    has_template: bool

    @property
    def synced_ago(self) -> str:
        return ago(self.sync.synced_at)

    @property
    def checked_ago(self) -> str:
        return ago(self.checked_at)

    @property
    def failed_ago(self) -> str:
        return ago(self.sync.failed_at)

    @property
    def problem(self) -> str:
        """The last error in words ("" when the last sync went well)."""
        explained = self.sync.error or self.sync.status
        return explained.sentence if explained else ""


def ago(moment: datetime | None) -> str:
    """ "3 hours ago"; "just now" under a minute, where timesince would say "0 minutes"."""
    if moment is None:
        return ""
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment)} ago"


def status_line(model: HubModel, check: CheckRun | None, *, has_template: bool) -> ModelStatusLine:
    """The status line of `model` from its row and the newest check already loaded (no query)."""
    done = check is not None and check.status in (CheckStatus.DONE, CheckStatus.FAILED)
    return ModelStatusLine(
        sync=describe(model),
        checked_at=check.finished_at if check is not None and done else None,
        checking=check is not None and not done,
        has_template=has_template,
    )


# --- the banner ------------------------------------------------------------------------------

#: The banner reuses an answer this young; older, it is asked again in the background.
HUB_BANNER_SECONDS = 30.0

_lock = threading.Lock()
_answer: tuple[float, bool] | None = None  # (monotonic time asked, unreachable)
_refreshing = False


def refresh_hub_banner() -> bool:
    """Ask the database now (one query) and keep the answer for the next pages."""
    global _answer
    unreachable = hub_unreachable()
    with _lock:
        _answer = (time.monotonic(), unreachable)
    return unreachable


def _refresh_in_background() -> None:
    global _refreshing
    try:
        refresh_hub_banner()
    except Exception:  # noqa: BLE001 - any database trouble: keep the last answer, try later
        logger.warning("could not tell whether the Hub is reachable", exc_info=True)
    finally:
        with _lock:
            _refreshing = False
        connections.close_all()  # this thread's own connections: none may outlive it


def hub_banner() -> bool:
    """Whether pages say the Hub is unreachable, without a query on the request's thread.

    The answer is refreshed at most every HUB_BANNER_SECONDS, by a background thread: a page
    never waits for it, and a page's query count stays what its view costs. A process's very
    first page therefore shows no banner; the pages after it do.
    """
    global _refreshing
    with _lock:
        answer = _answer
        stale = answer is None or time.monotonic() - answer[0] >= HUB_BANNER_SECONDS
        if stale and not _refreshing:
            _refreshing = True
            threading.Thread(
                target=_refresh_in_background, name="hub-banner-refresh", daemon=True
            ).start()
    return answer[1] if answer is not None else False


def forget_hub_banner() -> None:
    """Drop the kept answer (tests; the next page asks again)."""
    global _answer
    with _lock:
        _answer = None
