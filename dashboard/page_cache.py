"""Rendered pages kept in the cache until what they show changes.

The dashboard is read far more than it changes. A page's cache key carries the *generations* of
what it shows, so a write starts a new generation of those only:

- `model:<repo id>`: a model's pages (page, badge, its API row); bumped when the model's row
  changes in a way a page shows, and when its snapshots, changes, checks or probes do;
- `template:<sha256>`: a template version's pages (source, pairs, diffs, API); bumped when a check
  of it is saved, and when a model that uses it changes;
- `listings`: pages that list models (catalog, search, the API's list); bumped when a model is
  added, or its shown fields change in a way that can move it in or out of a listing (its
  name, tags, format, status, drift, a template change);
- `verdicts`: the listings whose filters or order read verdicts (`?verdict=safe`, a reader's
  setup, `sort=reuse`); bumped with any model's verdicts, which can move an unlisted model in;
- `all`: every page; bumped only by a delete, whose reach is not worth tracing.

A listing also keeps the models it shows (`shows`): it is rebuilt when one of them changes,
verdict included, and stays a hit when a model it does not show gets a new verdict. A listing
that does not say what it shows depends on `verdicts` too.

A save that changes nothing a page shows (an unchanged sync writes only `last_synced_at`)
bumps nothing. A page whose generation moved on is rebuilt by the first request that sees it;
requests meanwhile (up to `REBUILD_LOCK_SECONDS`) get the copy from before the write, marked
`X-Cache: stale`, so a write costs one render per page instead of one per waiting reader. A
TTL bounds what a bulk `.update()` elsewhere could leave stale, and a view opts out per
response (`Cache-Control: no-store`) when the page shows live state.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, transaction
from django.db.models.signals import post_delete, post_save
from django.http import HttpRequest, HttpResponse

from registry.models import (
    CheckRun,
    HubModel,
    NamedTemplate,
    ProbeRun,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
)
from registry.signals import catalog_changed
from registry.verdicts import models_using
from workers.health import cached_status

from .status import hub_banner

logger = logging.getLogger(__name__)
GENERATION_PREFIX = "dashboard:generation:"
DEFAULT_SECONDS = 60
ALL, LISTINGS, VERDICTS = "all", "listings", "verdicts"
View = TypeVar("View", bound=Callable[..., HttpResponse])

#: HubModel fields whose change alone starts no generation: not shown, or counters that move
#: on every sync (a sync time shown as "3 minutes ago", downloads, likes) where a page up to
#: the TTL old is as good. An unchanged repo's sync writes only these.
QUIET_FIELDS = frozenset(
    {"last_synced_at", "template_files", "history_complete", "history_from", "downloads", "likes"}
)
#: HubModel fields that a new verdict writes (`registry.verdicts`): they change what the model's
#: pages and the listings showing it say, and which models a verdict filter (or the reuse
#: order) lists, but not which models a search or any other filter lists.
VERDICT_FIELDS = frozenset({"verdict", "verdict_summary", "verdict_updated_at", "reuse"})


def seconds() -> int:
    """How long a page may be served from the cache (0 turns the cache off)."""
    return int(getattr(settings, "DASHBOARD_PAGE_CACHE_SECONDS", DEFAULT_SECONDS))


def model_scope(repo_id: str) -> str:
    return f"model:{repo_id.lower()}"


def template_scope(sha256: str) -> str:
    return f"template:{sha256}"


# Each process rereads a generation at most this often: a cache hit then costs one lookup, and
# a change shows everywhere within a second. The memo is bounded: past its size it starts over.
GENERATION_TTL = 1.0
MEMO_SIZE = 10_000
_memo: dict[str, tuple[float, str]] = {}


def generations(scopes: list[str]) -> list[str]:
    """The current generation of each scope (one cache round trip for those not memoised)."""
    now = time.monotonic()
    stale = [n for n in scopes if n not in _memo or now - _memo[n][0] > GENERATION_TTL]
    if stale:
        if len(_memo) > MEMO_SIZE:
            _memo.clear()
        found = cache.get_many([GENERATION_PREFIX + n for n in stale])
        for name in stale:
            _memo[name] = (now, str(found.get(GENERATION_PREFIX + name) or 0))
    return [_memo[n][1] for n in scopes]


def bump(*scopes: str) -> None:
    """Start a new generation of these scopes: their pages are rebuilt on their next request."""
    if not scopes:
        return
    # A timestamp, not a counter: no race between two writers, and it survives a cache flush.
    stamp = time.time_ns()
    try:
        cache.set_many({GENERATION_PREFIX + n: stamp for n in scopes}, None)
    except Exception:  # noqa: BLE001 - a save must not fail because the cache is down
        logger.warning("page cache unavailable; cached pages expire by their TTL only")
    for name in scopes:
        _memo.pop(name, None)  # this process sees its own change at once


class _Pending(threading.local):
    """What this thread wrote in its open transaction and has not bumped yet: scopes, and
    models whose scopes are looked up at commit (with their current templates' when True)."""

    def __init__(self) -> None:
        self.scopes: dict[str, None] = {}
        self.models: dict[int, bool] = {}
        #: Models whose scopes the writer gave (`catalog_changed`'s `shown`): not looked up.
        self.known: dict[int, list[str]] = {}


_pending = _Pending()


def bump_on_commit(
    scopes: Iterable[str] = (),
    models: Iterable[int] = (),
    *,
    templates: bool = False,
    known: Mapping[int, list[str]] | None = None,
) -> None:
    """Bump `scopes`, and the scopes of `models` (with their current templates' if
    `templates`), once the current transaction commits (at once outside one).

    Not before: a page rendered between the save and the commit shows the old rows, and would
    be kept under the new generation. A transaction's scopes go out together, by the first of
    its commit callbacks: the models' scopes in one query, then one cache round trip (a sync
    saves a model and several parts of it, each with its scopes). A savepoint rolled back
    leaves what it wrote pending: it goes out with the next commit, one invalidation too many,
    never one too few.

    `known` gives some of `models`' scopes as they will be at commit (with their templates'),
    from a writer that has them at hand: those models are not looked up. A later write to one
    of them that does not give them again brings the lookup back."""
    names = dict.fromkeys(scopes)
    models = list(models)
    if not names and not models:
        return
    for name in names:
        _memo.pop(name, None)  # this process sees its own change at once
    _pending.scopes.update(names)
    for model_id in models:
        _pending.models[model_id] = _pending.models.get(model_id, False) or templates
        if known is not None and model_id in known:
            _pending.known[model_id] = list(known[model_id])
        else:
            _pending.known.pop(model_id, None)
    transaction.on_commit(_bump_pending)


def discard_pending() -> None:
    """Forget what this thread has not bumped yet (tests, whose transactions never commit)."""
    _pending.scopes, _pending.models, _pending.known = {}, {}, {}


def _bump_pending() -> None:
    names, models, known = _pending.scopes, _pending.models, _pending.known
    discard_pending()
    for given in known.values():
        names.update(dict.fromkeys(given))
    models = {pk: templates for pk, templates in models.items() if pk not in known}
    if models:
        try:
            names.update(dict.fromkeys(_scopes_of_models(models)))
        except DatabaseError:
            logger.warning("could not read the changed models' scopes; every page moves on")
            names[ALL] = None
    if names:
        bump(*names)


def _scopes_of_models(models: dict[int, bool]) -> list[str]:
    """Each model's scope and, where asked, its current snapshot's templates' (default and
    named: their pages list the models that use them, with each one's verdict). One query."""
    rows = HubModel.objects.filter(pk__in=list(models)).values_list(
        "pk",
        "repo_id",
        "current_snapshot__default_template__sha256",
        "current_snapshot__named_templates__version__sha256",
    )
    scopes: list[str] = []
    for pk, repo_id, default, named in rows:
        scopes.append(model_scope(repo_id))
        if models[pk]:
            scopes += [template_scope(sha) for sha in (default, named) if sha]
    return scopes


def _on_model_saved(instance: HubModel, update_fields: Any = None, **_: Any) -> None:
    fields = None if update_fields is None else set(update_fields)
    if fields is not None and fields <= QUIET_FIELDS:
        return  # nothing a page shows
    verdicts_only = fields is not None and fields <= QUIET_FIELDS | VERDICT_FIELDS
    bump_on_commit([VERDICTS if verdicts_only else LISTINGS], [instance.pk], templates=True)


def _on_catalog_changed(
    model_ids: Iterable[int] | None = (),
    shown: Mapping[int, tuple[str, Sequence[str]]] | None = None,
    verdicts: bool = False,
    **_: Any,
) -> None:
    if model_ids is None:  # any model (the signal's contract): every page
        bump_on_commit([ALL])
        return
    known = {
        pk: [model_scope(repo_id), *map(template_scope, shas)]
        for pk, (repo_id, shas) in (shown or {}).items()
    }
    listings = VERDICTS if verdicts else LISTINGS
    bump_on_commit([listings], list(model_ids), templates=True, known=known)


def _on_check_saved(instance: CheckRun, **_: Any) -> None:
    sha = (
        TemplateVersion.objects.filter(pk=instance.template_version_id)
        .values_list("sha256", flat=True)
        .first()
    )
    users = models_using([instance.template_version_id]).values_list("repo_id", flat=True)
    bump_on_commit([*([template_scope(sha)] if sha else []), *map(model_scope, users)])


def _on_part_of_a_model_saved(instance: Any, **_: Any) -> None:
    """A snapshot, named template, change or probe: its model's pages (and the feed's list)."""
    model_id = getattr(instance, "model_id", None)
    if model_id is None and isinstance(instance, NamedTemplate):
        model_id = (
            TemplateSnapshot.objects.filter(pk=instance.snapshot_id)
            .values_list("model_id", flat=True)
            .first()
        )
    # The feeds and "template changed" in the catalog list changes.
    scopes = [LISTINGS] if isinstance(instance, TemplateChange) else []
    bump_on_commit(scopes, [model_id] if model_id is not None else [])


def _on_delete(**_: Any) -> None:
    bump_on_commit([ALL])


catalog_changed.connect(_on_catalog_changed, dispatch_uid="dashboard-catalog-changed")
post_save.connect(_on_model_saved, sender=HubModel, dispatch_uid="dashboard-save-model")
post_save.connect(_on_check_saved, sender=CheckRun, dispatch_uid="dashboard-save-check")
for _part in (TemplateSnapshot, NamedTemplate, TemplateChange, ProbeRun):
    post_save.connect(
        _on_part_of_a_model_saved, sender=_part, dispatch_uid=f"dashboard-save-{_part}"
    )
for _model in (HubModel, TemplateSnapshot, NamedTemplate, TemplateChange, CheckRun, ProbeRun):
    post_delete.connect(_on_delete, sender=_model, dispatch_uid=f"dashboard-del-{_model}")


def scopes_of(kwargs: dict[str, Any]) -> list[str]:
    """What a view's page shows, from its URL: a model, template versions, or a listing."""
    scopes = [ALL]
    if "org" in kwargs and "name" in kwargs:
        scopes.append(model_scope(f"{kwargs['org']}/{kwargs['name']}"))
    for name in ("sha256", "old_sha256"):
        if kwargs.get(name):
            scopes.append(template_scope(str(kwargs[name])))
    if len(scopes) == 1:
        scopes.append(LISTINGS)
    return scopes


#: Where a listing view leaves what it shows, for `cached_page` (`shows`).
_SHOWN = "_page_cache_shows"


def shows(request: HttpRequest, repo_ids: Iterable[str], *, reads_verdicts: bool) -> None:
    """A listing view says what its page shows: the models of its rows, and whether its
    filters or order read verdicts (then any model's new verdict may change what it lists).
    Its cached copy is then rebuilt when one of those models changes, not when any does."""
    scopes = [model_scope(repo_id) for repo_id in repo_ids]
    setattr(request, _SHOWN, [*scopes, VERDICTS] if reads_verdicts else scopes)


def _shown(request: HttpRequest, base: list[str]) -> list[str]:
    """The scopes a page found while rendering: what a listing said it shows; a listing that
    said nothing depends on every verdict; other pages' scopes are all in their URL."""
    said = getattr(request, _SHOWN, None)
    if said is not None:
        return list(said)
    return [VERDICTS] if LISTINGS in base else []


class Kept(NamedTuple):
    """A page in the cache: its generations when it was rendered (those of its URL's scopes,
    and of the scopes it found while rendering), and the response."""

    generations: list[str]
    content: bytes
    content_type: str
    cache_control: str
    #: Scopes known only once the page was rendered (a listing's models, `shows`).
    shown: list[str]
    #: When the render began, for each of `shown` (time.time_ns, as a bump stamps).
    shown_since: str


def _banners() -> str:
    """What the site's banners say now (the service's problems, the Hub out of reach). Both
    answers are kept by the process, so asking costs no query. Part of a page's key: a copy
    rendered under a banner is never served once the banner is gone, nor one without it
    while the banner is up (a copy from the first minutes, when the worker and beat had not
    reported yet, kept saying so after /healthz said ok)."""
    problems = cached_status().problems
    return "\n".join([*problems, "hub unreachable" if hub_banner() else ""])


def _key(request: HttpRequest, banners: str) -> str:
    htmx = request.headers.get("HX-Request", "") + "|" + request.headers.get("HX-Target", "")
    raw = f"{htmx}|{request.get_full_path()}|{banners}"
    # v2: `Kept`, which a copy of the first layout (a plain tuple) is not.
    return "dashboard:page:v2:" + hashlib.sha256(raw.encode()).hexdigest()


#: While one process renders a page whose generation moved on, others serve the copy they have
#: for at most this long (the lock's life): a write never sends every reader to render at once.
REBUILD_LOCK_SECONDS = 10


def _up_to_date(stored: list[str], current: list[str]) -> bool:
    """Whether a copy rendered at generations `stored` shows at least `current`. Generations are
    write times, so a copy another process rendered after a write this process has not read yet
    (its memo is up to a second old) counts as fresh: the processes never re-render in turn."""
    return len(stored) == len(current) and all(
        int(kept) >= int(now) for kept, now in zip(stored, current, strict=True)
    )


def _fresh(kept: Kept, current: list[str]) -> bool:
    """Whether `kept` shows at least the `current` generations of its URL's scopes, and of
    what it found while rendering: no scope of those moved on since its render began."""
    if not _up_to_date(kept.generations, current):
        return False
    if not kept.shown:
        return True
    since = int(kept.shown_since)
    return all(int(now) <= since for now in generations(kept.shown))


def _respond(kept: Kept, state: str) -> HttpResponse:
    response = HttpResponse(kept.content, content_type=kept.content_type)
    if kept.cache_control:
        response["Cache-Control"] = kept.cache_control
    response["X-Cache"] = state
    return response


def _is_staff(request: HttpRequest) -> bool:
    """Staff pages carry action forms with a CSRF token: never kept, never served from the cache."""
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_staff)


def cached_page(view: View) -> View:
    """Serve GETs of `view` from the cache while the catalog has not changed."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        timeout = seconds()
        if timeout <= 0 or request.method != "GET" or _is_staff(request):
            return view(request, *args, **kwargs)
        try:
            key = _key(request, _banners())
            scopes = scopes_of(kwargs)
            current = generations(scopes)
            kept = cache.get(key)
            if kept is not None and _fresh(kept, current):
                return _respond(kept, "hit")
            # Out of date (or absent): one process renders it; the others keep serving the old
            # copy until it lands, instead of all rendering the same page at once.
            if kept is not None and not cache.add(f"{key}:rebuild", 1, REBUILD_LOCK_SECONDS):
                return _respond(kept, "stale")
        except Exception:  # noqa: BLE001 - any backend error (Redis down, table missing)
            logger.warning("page cache unavailable; rendering %s", request.path, exc_info=True)
            return view(request, *args, **kwargs)
        # Before the render: a write that lands while it reads the rows is stamped later.
        since = str(time.time_ns())
        response = view(request, *args, **kwargs)
        cache_control = response.get("Cache-Control", "")
        try:
            if response.status_code == 200 and "no-store" not in cache_control:
                shown = _shown(request, scopes)
                entry = Kept(
                    current,
                    response.content,
                    response["Content-Type"],
                    cache_control,
                    shown,
                    since,
                )
                cache.set(key, entry, timeout)
                response["X-Cache"] = "miss"
            cache.delete(f"{key}:rebuild")
        except Exception:  # noqa: BLE001 - the page is rendered; keeping it is optional
            logger.warning("page cache unavailable; not keeping %s", request.path)
        return response

    return wrapper  # type: ignore[return-value]
