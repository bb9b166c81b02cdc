"""The catalog's state, all of it in the query string: search, filters, sort, page."""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from functools import cached_property
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import BigIntegerField, BooleanField, F, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Upper
from django.db.models.lookups import Exact
from django.http import QueryDict
from django.urls import NoReverseMatch, reverse

from checks.clients import PROFILES
from checks.reuse import CACHE_CLASS_LABELS
from checks.setups import (
    THINKING_DEFAULT,
    THINKING_OFF,
    THINKING_ON,
    THINKING_WORDS,
    Setup,
    given_parts,
)
from registry.models import (
    SEARCH_TERMS,
    Drift,
    HubModel,
    ModelFormat,
    ModelStatus,
    ProbeStatus,
    TemplateVersion,
    Thinking,
    Tools,
    Verdict,
    search_terms,
    word_query,
)
from registry.models.check_runs import thinking_badges

PAGE_SIZE = 50

SORTS: dict[str, tuple[Any, ...]] = {
    "downloads": ("-downloads", "repo_id"),
    # Models not checked yet (no figure) last.
    "reuse": (F("reuse").desc(nulls_last=True), "repo_id"),
    # Models with no template yet (no date) last, on every database (PostgreSQL puts nulls
    # first in a descending order).
    "changed": (F("last_template_change_at").desc(nulls_last=True), "repo_id"),
    # As a reader reads names: "ai-sage/…" between "Acme/…" and "Qwen/…", not after every
    # capital (the database's collation may compare bytes). The walk reads the index on
    # upper(repo_id) that the case-insensitive lookups use (HubModel.Meta).
    "name": (Upper("repo_id"), "repo_id"),
}
SORT_LABELS = {
    "downloads": "Downloads",
    "reuse": "Prompt reuse",
    "changed": "Last template change",
    "name": "Name",
}
# Besides how the switch relates to the verdict: which models keep the cache with thinking on/off.
THINKING_CHOICES = {
    "safe_on": "Cache-safe with thinking on",
    "safe_off": "Cache-safe with thinking off",
    **dict(Thinking.choices),
    # The reader's setup (checks.setups): the verdict shown and filtered is for that setting.
    THINKING_DEFAULT: "Verdict with the template's defaults",
    THINKING_OFF: f"Verdict with {THINKING_WORDS[THINKING_OFF]}",
    THINKING_ON: f"Verdict with {THINKING_WORDS[THINKING_ON]}",
}
SETUP_THINKING = (THINKING_DEFAULT, THINKING_OFF, THINKING_ON)
CLIENT_CHOICES = {p.name: p.label for p in PROFILES}
ENGINE_CHOICES = dict(CACHE_CLASS_LABELS)
HYBRID_CHOICES = {"yes": "Hybrid (recurrent) only", "no": "Attention only"}
FORMAT_CHOICES = dict(ModelFormat.choices)
#: How a derivative's template relates to its tracked base's (HubModel.drift).
DRIFT_CHOICES = {
    "differs": "Template differs from base",
    Drift.OLDER: "An older template of the base's",
    Drift.EDITED: "Edited template",
    Drift.SAME: "Same template as the base",
}
# The catalog needs only these columns; the rest of HubModel stays in the database. Not
# `last_synced_at`: a sync of an unchanged repo writes it and starts no new generation of the
# pages (dashboard/page_cache.py), so no listing may show it; and Django reads each timestamp in
# Python (its time zone loader), 0.3 ms a page of 50 in one process.
MODEL_COLUMNS = (
    "repo_id",
    "author",
    "family",
    "downloads",
    "verdict",
    "verdict_summary",
    "is_hybrid",
    "is_demo",
    "format",
    "drift",
    "base_model",
    "status",
    "last_template_change_at",
    "sync_error",
    "reuse",
)
#: Its catalog row's (`CatalogVerdict`, joined: all None while a model has none yet).
VERDICT_COLUMNS = ("thinking", "thinking_off", "thinking_on", "tools", "probe")
LIST_FIELDS = MODEL_COLUMNS + tuple(f"catalog_verdict__{c}" for c in VERDICT_COLUMNS)


@dataclass(frozen=True, slots=True)
class RowVerdicts:
    """A catalog row's per-variant verdicts (`CatalogVerdict`'s columns the catalog shows)."""

    thinking: str
    thinking_off: str
    thinking_on: str
    tools: str
    probe: str

    @property
    def thinking_badges(self) -> list[tuple[str, str]]:
        return thinking_badges(self.thinking, self.thinking_off, self.thinking_on)


@dataclass(frozen=True, slots=True)
class CatalogRow:
    """One model as the catalog lists it: plain values, read as tuples. Building a `HubModel`
    and its `CatalogVerdict` for each of 50 rows cost 1 ms of a search's 5 (at 100,000 models,
    docs/dashboard.md), as much as PostgreSQL took to find and send them."""

    repo_id: str
    author: str
    family: str
    downloads: int
    verdict: str
    verdict_summary: str
    is_hybrid: bool
    is_demo: bool
    format: str
    drift: str
    base_model: str
    status: str
    last_template_change_at: datetime | None
    sync_error: str
    reuse: float | None
    verdicts: RowVerdicts | None
    #: The verdict for the reader's setup, when one is chosen (`CatalogQuery.setup_active`).
    setup_verdict: str | None

    @classmethod
    def of(cls, values: tuple[Any, ...]) -> CatalogRow:
        """From the values of `CatalogQuery.columns`."""
        n, end = len(MODEL_COLUMNS), len(LIST_FIELDS)
        verdicts = values[n:end]
        row_verdicts = RowVerdicts(*verdicts) if verdicts[0] is not None else None
        setup_verdict = values[end] if len(values) > end else None
        return cls(*(*values[:n], row_verdicts, setup_verdict))


def _choice(value: str | None, allowed: object) -> str:
    """An unknown filter value is ignored (an old or hand-edited link still shows something)."""
    value = (value or "").strip()
    return value if value and value in allowed else ""  # type: ignore[operator]


#: The values of the filters of the models' own choices, read once: `Verdict.values` and the
#: like build a list on every call, three times a page.
VERDICTS = frozenset(Verdict.values)
TOOLS = frozenset(Tools.values)
PROBES = frozenset(ProbeStatus.values)

#: The choice filters (an unknown value is ignored, and said so).
FILTERS = (
    "verdict",
    "thinking",
    "client",
    "engine",
    "hybrid",
    "format",
    "drift",
    "tools",
    "probe",
    "sort",
)


@dataclass(frozen=True)
class CatalogQuery:
    q: str = ""
    verdict: str = ""
    thinking: str = ""
    client: str = ""
    engine: str = ""
    hybrid: str = ""
    format: str = ""
    drift: str = ""
    tools: str = ""
    probe: str = ""
    author: str = ""
    sort: str = "downloads"
    page: str = "1"

    @property
    def author_feed(self) -> str:
        """The URL of the author's feed; "" for an author no feed URL can name (the filter
        takes any text, and a repo the Hub names in other letters than an id's)."""
        try:
            return reverse("dashboard:author_feed", args=[self.author]) if self.author else ""
        except NoReverseMatch:
            return ""

    def ignored(self, params: QueryDict) -> list[str]:
        """The `name=value` filters of the link this query was read from (`params`, as
        `from_params` read them) that this catalog does not know (shown as ignored, so a
        mistyped or outdated link does not silently show everything)."""
        dropped = []
        for name in FILTERS:
            given = (params.get(name) or "").strip()
            if given and given != getattr(self, name):
                dropped.append(f"{name}={given[:40]}")
        return dropped

    @classmethod
    def from_params(cls, params: QueryDict) -> CatalogQuery:
        # The setup's parts as every surface reads them (checks.setups.setup_value).
        setup = given_parts(params)
        return cls(
            q=params.get("q", "").strip()[:200],
            verdict=_choice(params.get("verdict"), VERDICTS),
            thinking=_choice(setup.get("thinking"), THINKING_CHOICES),
            client=_choice(setup.get("client"), CLIENT_CHOICES),
            engine=_choice(setup.get("engine"), ENGINE_CHOICES),
            hybrid=_choice(params.get("hybrid"), HYBRID_CHOICES),
            format=_choice(params.get("format"), FORMAT_CHOICES),
            drift=_choice(params.get("drift"), DRIFT_CHOICES),
            tools=_choice(params.get("tools"), TOOLS),
            probe=_choice(params.get("probe"), PROBES),
            author=params.get("author", "").strip()[:100],
            sort=_choice(params.get("sort"), SORTS) or "downloads",
            page=params.get("page", "1")[:10],
        )

    def models(
        self,
        terms: list[tuple[str, bool]] | None = None,
        parts: tuple[str | None, ...] = (),
    ) -> QuerySet[HubModel]:
        """The matching models, sorted, with only the columns a catalog row shows. `terms`:
        these (as `search_terms` writes them) in place of the search's, each asked of the
        trigram index as `parts` says (`HubModelQuerySet.having`)."""
        return self._listed(self._matching(terms=terms, parts=parts))

    def keys_in_order(self, terms: list[tuple[str, bool]] | None = None) -> QuerySet[HubModel, int]:
        """The matching models' keys in the catalog's order: for a search alone, what its
        order's covering index (registry migration 0019) answers without reading the table.
        A walk tests each model it meets, so each term is found as a scan finds it
        (`HubModelQuerySet.search`'s `scanned`)."""
        walk = self._matching(scanned=True, terms=terms)
        return walk.order_by(*SORTS[self.sort]).values_list("pk", flat=True)

    def by_keys(self, keys: list[int]) -> QuerySet[HubModel]:
        """The models with these keys as `models()` lists them: the same columns and order, no
        filter. For keys `models()` found (`CappedPaginator`): PostgreSQL then reads them by
        their key instead of searching again."""
        return self._listed(HubModel.objects.filter(pk__in=keys))

    def rows_by_key(self, keys: list[int], bottom: int = 0, top: int | None = None) -> list[Any]:
        """The values of `columns` for rows `bottom` to `top` of `by_keys(keys)`, as tuples.
        On PostgreSQL from the statement kept for this query's order and setup
        (`keyed_statement`), the keys one array: the ORM built, compiled and bound the query
        again for each page, with a parameter a key (docs/dashboard.md, "Statements kept by
        shape, and a walk that finds a term with strpos")."""
        if connection.vendor != "postgresql":
            return list(self.by_keys(keys).values_list(*self.columns)[bottom:top])
        statement = keyed_statement(self.sort, self.setup_path if self.setup_active else None)
        limit = len(keys) if top is None else max(top - bottom, 0)
        return read_kept(statement, {KEYS: keys}, limit, bottom)

    @property
    def setup_path(self) -> tuple[str, str, str]:
        """Where the reader's setup's verdict sits in a catalog row's per-setup verdicts
        (`CatalogVerdict.setups`): client, thinking setting, engine."""
        setup = self.setup
        return (setup.client, setup.thinking, setup.engine)

    def _listed(self, models: QuerySet[HubModel]) -> QuerySet[HubModel]:
        return listed(models, self.sort, self.setup_path if self.setup_active else None)

    def _matching(
        self,
        scanned: bool = False,
        terms: list[tuple[str, bool]] | None = None,
        parts: tuple[str | None, ...] = (),
    ) -> QuerySet[HubModel]:
        # Repo id, family, tags, model type; the author is the repo id's first part.
        # A repo the Hub never had is not listed: anyone may ask to track a name, and a
        # misspelt or made-up one would sit in the catalog for good. Its page still says what
        # the Hub answered; one that was there and vanished keeps its row and its history.
        if terms is None:
            terms = search_terms(self.q)
            parts = () if scanned else index_parts(terms)
        models = HubModel.objects.having(terms, scanned=scanned, parts=parts).exclude(
            status=ModelStatus.MISSING, current_snapshot__isnull=True
        )
        if self.setup_active:
            if self.verdict:
                models = models.filter(Exact(setup_verdict(self.setup_path), self.verdict))
        elif self.verdict:
            models = models.filter(verdict=self.verdict)
        if self.thinking in SETUP_THINKING:
            pass
        elif self.thinking == "safe_on":
            models = models.filter(catalog_verdict__thinking_on=Verdict.SAFE)
        elif self.thinking == "safe_off":
            models = models.filter(catalog_verdict__thinking_off=Verdict.SAFE)
        elif self.thinking:
            models = models.filter(catalog_verdict__thinking=self.thinking)
        if self.hybrid:
            models = models.filter(is_hybrid=self.hybrid == "yes")
        if self.format:
            models = models.filter(format=self.format)
        if self.drift == "differs":
            models = models.filter(drift__in=(Drift.OLDER, Drift.EDITED))
        elif self.drift:
            models = models.filter(drift=self.drift)
        if self.tools:
            models = models.filter(catalog_verdict__tools=self.tools)
        if self.probe:
            if self.probe == ProbeStatus.NONE:
                models = models.filter(
                    Q(catalog_verdict__isnull=True) | Q(catalog_verdict__probe=self.probe)
                )
            else:
                models = models.filter(catalog_verdict__probe=self.probe)
        if self.author:
            # As the Hub takes an owner's name, whatever its case ("qwen" is Qwen); through the
            # index on upper(author) (HubModel.Meta).
            models = models.filter(author__iexact=self.author)
        return models

    @property
    def columns(self) -> tuple[str, ...]:
        """What a `CatalogRow` is read from: `LIST_FIELDS`, and the setup's verdict last."""
        return (*LIST_FIELDS, "setup_verdict") if self.setup_active else LIST_FIELDS

    @property
    def params(self) -> dict[str, str]:
        """The non-default parts, in a fixed order: what a shareable link carries."""
        defaults = CatalogQuery()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(defaults, f.name)
        }

    def url(self, **changes: str) -> str:
        """This state with some parts changed, as `?…` (a filter change returns to page 1)."""
        if "page" not in changes:
            changes["page"] = "1"
        query = urlencode(replace(self, **changes).params)
        return f"?{query}" if query else "?"

    @property
    def setup_active(self) -> bool:
        """A reader's setup is chosen: rows show (and `verdict` filters) its verdict."""
        return bool(self.client or self.engine or self.thinking in SETUP_THINKING)

    @property
    def setup(self) -> Setup:
        """The reader's setup its rows are judged for (when `setup_active`)."""
        defaults = Setup()
        return Setup(
            self.client or defaults.client,
            self.engine or defaults.engine,
            self.thinking if self.thinking in SETUP_THINKING else defaults.thinking,
        )

    @property
    def setup_query(self) -> str:
        """The reader's setup as a model page's query string ("" when none is chosen): a row's
        link carries it, so the model page judges the setup the row's badge was for."""
        return self.setup.query() if self.setup_active else ""

    @property
    def setup_spelling(self) -> dict[str, str] | None:
        """The setup parts of this catalog's one address (`Setup.params`: `?client=typical`
        is `?thinking=default`), the same as its own links and menus send. None while the
        thinking menu holds a filter: an explicit typical value may then be all that chooses
        the setup, and is kept (its menu shows it)."""
        if self.thinking and self.thinking not in SETUP_THINKING:
            return None
        return self.setup.params if self.setup_active else {}

    @property
    def active(self) -> bool:
        return any(k != "page" and k != "sort" for k in self.params)

    @property
    def reads_verdicts(self) -> bool:
        """Whether its filters or order read verdicts: then a new verdict for any model can
        change which models it lists (the page cache's `verdicts` scope)."""
        return bool(
            self.verdict
            or self.thinking
            or self.tools
            or self.probe
            or self.setup_active
            or self.sort == "reuse"
        )


def setup_verdict(path: tuple[str, str, str]) -> KeyTextTransform:
    """The verdict at `path` (`CatalogQuery.setup_path`) of a catalog row's per-setup
    verdicts."""
    client, thinking, engine = path
    inner = KeyTransform(client, KeyTransform(thinking, "catalog_verdict__setups"))
    return KeyTextTransform(engine, inner)


def stored_setup_verdict(model: HubModel, setup: Setup) -> str | None:
    """The verdict for `setup` a model's catalog row keeps (what the catalog lists for it, the
    same path as `setup_verdict`), None where the row has none."""
    row = getattr(model, "catalog_verdict", None)
    found: Any = row.setups if row is not None else None
    for part in (setup.thinking, setup.client, setup.engine):
        found = found.get(part) if isinstance(found, dict) else None
    return found if isinstance(found, str) else None


def listed(
    models: QuerySet[HubModel], sort: str, setup: tuple[str, str, str] | None
) -> QuerySet[HubModel]:
    """`models` as the catalog lists them: `LIST_FIELDS` (and the verdict at `setup`, when a
    setup is chosen), the verdicts' row joined, in `sort`'s order."""
    if setup is not None:
        models = models.annotate(setup_verdict=setup_verdict(setup))
    return models.select_related("catalog_verdict").only(*LIST_FIELDS).order_by(*SORTS[sort])


#: Where a kept statement (`keyed_statement`, `search_statement`) takes its values: marks
#: among its parameters, each replaced by its value when it runs (`read_kept`). From Unicode's
#: private use area, so that no search term is one (`search_terms` leaves them as they are).
KEYS = "\ue000keys"
TERMS = tuple(f"\ue000{i}" for i in range(SEARCH_TERMS))
#: Where a term's part asked of the trigram index goes (`index_part`).
PARTS = tuple(f"\ue001{i}" for i in range(SEARCH_TERMS))
#: Where the keys of "walked rows" and "sorted rows" (`search_statement`) take their limit
#: and offset, and the most matches "sorted rows" reads.
KEYS_LIMIT, KEYS_OFFSET, SORT_MOST = "\ue002limit", "\ue002offset", "\ue002most"
#: The kinds of a search's terms, its kept statements' shape (`search_statement`): a word
#: (the word index), a text (the trigram index), a text of which a part is asked of the
#: trigram index (`index_part`).
WORD, TEXT, PART = "word", "text", "part"
#: The most statements a process keeps of each kind, the least recently run dropped first: a
#: search's terms, each of three kinds, can make up to 3 ** `SEARCH_TERMS` shapes in each
#: order, though most searches are one or two terms (twelve shapes an order).
KEPT_STATEMENTS = 1024
#: What a sorted read reads of each match (`sorted_read`).
SORTED_COLUMNS = ("pk", "downloads", "reuse", "last_template_change_at", "repo_id")


@functools.lru_cache(maxsize=KEPT_STATEMENTS)
def keyed_statement(sort: str, setup: tuple[str, str, str] | None) -> tuple[str, tuple[Any, ...]]:
    """The SQL that reads the rows of some keys as the catalog lists them in `sort`'s order
    (with the verdict at `setup`), and its parameters: `KEYS` where the keys go (one array),
    then a limit and an offset. The shapes are few (four orders, and each setup of the few
    clients, thinking settings and engines: at most a few hundred); a search term is not part
    of one, so a new search reads its rows by a statement already kept. PostgreSQL only
    (`= ANY` of an array)."""
    where = RawSQL(
        f'"{HubModel._meta.db_table}"."id" = ANY(%s)', (KEYS,), output_field=BooleanField()
    )
    columns = (*LIST_FIELDS, "setup_verdict") if setup is not None else LIST_FIELDS
    rows = listed(HubModel.objects.filter(where), sort, setup).values_list(*columns)
    sql, params = rows.query.sql_with_params()
    return f"{sql} LIMIT %s OFFSET %s", tuple(params)


@functools.lru_cache(maxsize=KEPT_STATEMENTS)
def search_statement(read: str, sort: str, kinds: tuple[str, ...]) -> tuple[str, tuple[Any, ...]]:
    """The SQL of one of the reads of a search with no filter (`CappedPaginator.unfiltered`)
    in `sort`'s order, whose terms are of `kinds` (`WORD`, `TEXT` or `PART`, as `term_kinds`
    says), and its parameters, `TERMS` and `PARTS` where the terms and their parts go
    (`term_values`): the same statement for every search of that shape.

    - "found": the keys of its first matches in no order, each with its block
      (`CappedPaginator.found`), then a limit;
    - "sorted rows": the sorted read of its matches (`sorted_read`, up to `SORT_MOST` + 1 of
      them), their number after each row, and while they are no more than `SORT_MOST`, the
      rows of the page's keys (`KEYS_LIMIT` past `KEYS_OFFSET`) read by key
      (`keyed_statement`); then the rows' limit and offset. Without a row, one row of nulls
      carries the number;
    - "listing": its rows in order as the catalog lists them, then a limit and an offset;
    - "walk", of a search alone (no word): its keys in order
      (`CatalogQuery.keys_in_order`), then a limit and an offset;
    - "walked rows", of a search alone: the rows of the keys its walk finds
      (`KEYS_LIMIT` of them, past `KEYS_OFFSET`), read by key (`keyed_statement`) in the
      same statement, then the rows' limit and offset.

    Each read whose rows are read by key in the same statement saves the round trip that
    sent the keys back, and planning a second statement (`rows_of_keys`)."""
    query = CatalogQuery(sort=sort)
    if read == "walked rows":
        walk_sql, walk_params = search_statement("walk", sort, kinds)
        return rows_of_keys(walk_sql, (*walk_params, KEYS_LIMIT, KEYS_OFFSET), sort)
    marked = [(TERMS[i], kind == WORD) for i, kind in enumerate(kinds)]
    parts = tuple(PARTS[i] if kind == PART else None for i, kind in enumerate(kinds))
    if read == "walk":
        sql, params = query.keys_in_order(marked).query.sql_with_params()
        return f"{sql} LIMIT %s OFFSET %s", tuple(params)
    if read == "listing":
        listing = query.models(marked, parts).values_list(*LIST_FIELDS)
        sql, params = listing.query.sql_with_params()
        return f"{sql} LIMIT %s OFFSET %s", tuple(params)
    matches = query.models(marked, parts).order_by()
    if read == "found":
        sql, params = matches.values_list("pk", BLOCK).query.sql_with_params()
        return f"{sql} LIMIT %s", tuple(params)
    if read != "sorted rows":
        raise ValueError(f"no kept read {read!r}")
    sql, params = matches.values_list(*SORTED_COLUMNS).query.sql_with_params()
    keys = (
        f"SELECT pk FROM found WHERE counted.n <= %s ORDER BY {SORTED_READ[sort]} "
        "LIMIT %s OFFSET %s"
    )
    rows, rows_params = rows_of_keys(keys, (SORT_MOST, KEYS_LIMIT, KEYS_OFFSET), sort)
    return (
        f"{found_matches(sql, '%s + 1')} "
        "SELECT page.*, counted.n FROM (SELECT count(*) AS n FROM found) AS counted "
        f"LEFT JOIN LATERAL ({rows}) AS page ON true ORDER BY {SORTED_READ[sort]}",
        (*params, SORT_MOST, *rows_params),
    )


def rows_of_keys(keys: str, params: tuple[Any, ...], sort: str) -> tuple[str, tuple[Any, ...]]:
    """`keyed_statement` for the catalog with no setup in `sort`'s order, reading the keys
    that the SQL `keys` (with `params`) selects instead of an array of them: one statement
    where a page sent the keys it had read back in another (a round trip, the second
    statement planned, the keys bound: 0.2 to 0.3 ms of a page at 100,000 models)."""
    sql, keyed = keyed_statement(sort, None)
    at = keyed.index(KEYS)
    head, mark, tail = sql.partition("= ANY(%s)")
    if not mark or head.count("%s") != at or mark in tail:
        raise ValueError("the keyed statement no longer reads its keys as one array")
    return f"{head}= ANY(ARRAY({keys})){tail}", (*keyed[:at], *params, *keyed[at + 1 :])


def found_matches(matches: str, limit: str) -> str:
    """The sorted read's `found`: the rows of `matches` (each match's `SORTED_COLUMNS`, in no
    order) up to `limit`, read once into a materialized set."""
    return f"WITH found ({', '.join(SORTED_COLUMNS)}) AS MATERIALIZED ({matches} LIMIT {limit})"


def sorted_read(matches: str, sort: str) -> str:
    """A sorted read of the rows of `matches` (each match's `SORTED_COLUMNS`, in no order):
    they are read into a materialized set, up to a limit (its first parameter after those of
    `matches`), counted and sorted in `sort`'s order, and the keys of one page of them
    returned (its last two: the page's size and offset)."""
    return (
        f"{found_matches(matches, '%s')} "
        "SELECT (SELECT count(*) FROM found), ARRAY(SELECT pk FROM found "
        f"ORDER BY {SORTED_READ[sort]} LIMIT %s OFFSET %s)"
    )


def term_kinds(terms: list[tuple[str, bool]], parts: tuple[str | None, ...]) -> tuple[str, ...]:
    """The kind of each of `terms` (as `search_terms` writes them), each asked of the trigram
    index as `parts` says (`index_parts`): the shape of their kept statements."""
    return tuple(
        WORD if word else PART if i < len(parts) and parts[i] is not None else TEXT
        for i, (_, word) in enumerate(terms)
    )


def term_values(
    terms: list[tuple[str, bool]], parts: tuple[str | None, ...] = ()
) -> dict[str, str]:
    """What each mark of `TERMS` and `PARTS` stands for in a search's kept statements, for its
    terms as `search_terms` writes them and their `parts` (`index_parts`): a term as a walk
    finds it (`strpos`), a term or its part as the trigram index finds it (`LIKE '%term%'`,
    its own `%`, `_` and backslash escaped as the ORM escapes them), and a word as the word
    index finds it (`word_query`)."""
    like = connection.ops.prep_for_like_query
    values = {}
    for i, (term, word) in enumerate(terms[:SEARCH_TERMS]):
        mark = TERMS[i]
        if word:
            values[word_query(mark)] = word_query(term)
            continue
        values[mark] = term
        values[f"%{mark}%"] = f"%{like(term)}%"
        part = parts[i] if i < len(parts) else None
        if part is not None:
            values[f"%{PARTS[i]}%"] = f"%{like(part)}%"
    return values


def read_kept(
    statement: tuple[str, tuple[Any, ...]], values: dict[str, Any], *tail: int
) -> list[tuple[Any, ...]]:
    """The rows of a kept statement (`keyed_statement`, `search_statement`) with `values` in
    place of its marks and `tail` after its parameters: the ORM built, compiled and bound each
    query again for each page (0.6 to 0.8 ms for a page's rows at 100,000 models in one
    process, and 1.7 ms in all with a parameter a key)."""
    sql, params = statement
    bound = [values.get(param, param) if isinstance(param, str) else param for param in params]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*bound, *tail])
        return list(cursor.fetchall())


def models_using(version: TemplateVersion, limit: int = 200) -> QuerySet[HubModel]:
    """Models that have had this version as their default template, most downloaded first."""
    return (
        HubModel.objects.filter(snapshots__default_template=version)
        .distinct()
        .only("repo_id", "verdict", "downloads")
        .order_by("-downloads", "repo_id")[:limit]
    )


#: A catalog page counts matches up to this many; past it, it says "200+" and pages on while a
#: page is full (`MAX_PAGES` at most): a search that broad is refined, not paged through. The
#: count is what a broad term costs (it reads about `COUNT_CAP` / the term's share of the
#: catalog rows, each tested with `LIKE`): at 100,000 models, counting "mistral" (one model in
#: nine) to 1,001 took 3.7 ms, to 201 0.8 (docs/dashboard.md, "Search at 100,000 models").
COUNT_CAP = 200
#: How deep a capped search pages (1,000 rows): each page past the first walks the rows before
#: it, so the pager stops where a search should be refined.
MAX_PAGES = 20

#: Past the cap, a page sorted by downloads (or by another of `SORTED_READ`) either walks the
#: order's index, testing each model until the page is full (about `top` / the term's share of
#: the catalog models), or reads every match by key and sorts them. PostgreSQL picks the walk
#: for any term it believes matches 1% of the catalog, and its estimate of a term's share
#: comes from 101 histogram bounds: a term matching 275 models of 100,000 walked 22,700 by
#: downloads (38 ms). The catalog picks for itself, from an estimate of the matches it reads
#: free with the keys (`matches_estimate`). The costs, measured at 100,000 models
#: (docs/dashboard.md, "Searches between narrow and broad"): the walk about 2 µs a model; the
#: sorted read 2 ms for its two queries and about 5 µs a match.
WALK_MS_PER_MODEL = 0.002
#: The same walk for a search alone (its terms, no filter), over the order's covering index
#: (registry migration 0019): it tests the index's copy of each model's searched text and reads
#: no row. Measured at 100,000 models, the keys alone: 6,045 models walked for "chat-4" in 4.4
#: ms, about 0.7 µs a model.
WALK_MS_PER_KEY = 0.0007
#: A search alone whose share of the catalog the sample puts at this or more walks its order's
#: covering index to the count's cap at once, and that walk is the count (`walked`): it reads
#: about (`COUNT_CAP` + 1) / share models, 3,200 or fewer (2 to 3 ms), where counting first
#: cost 0.8 to 3.4 ms and the walk after it came on top (at 100,000 models, "mistral": 1.4 ms
#: walked to the cap, 3.4 + 0.7 counted then walked; "chat-4", a share of 3.2%: 4.4 against
#: 1.6 + 1.2, so it counts first).
WALK_ALONE_SHARE = 1 / 16
SORT_MS = 2.0
SORT_MS_PER_MATCH = 0.005
#: The sorted read reads at most this many matches, and never more than the number past which
#: the walk costs less (`break_even`); past it (the estimate was low) the page walks after all.
SORT_CAP = 2000
#: The orders the sorted read gives, as `SORTS` has them, over the model's own columns. Each
#: has an index that a page can walk, and the same trap: sorted by name, "org-42" walked 84,000
#: models to reach its repo ids (422 ms).
SORTED_READ = {
    "downloads": "downloads DESC, repo_id",
    "reuse": "reuse DESC NULLS LAST, repo_id",
    "changed": "last_template_change_at DESC NULLS LAST, repo_id",
    "name": "upper(repo_id), repo_id",
}
#: How long a process keeps the table's size (`table_blocks`): an estimate only picks a plan,
#: never the rows.
TABLE_SECONDS = 60.0
#: The blocks of the table a process samples (`search_sample`), and how long it keeps them: a
#: term's share of the catalog changes slowly. PostgreSQL's own sample of the column, its
#: histogram's 101 bounds, are quantiles of its order, where an organisation's models sit
#: together: one bound among the 275 of "org-42" reads as 2% of the catalog, none as 1%.
SAMPLE_BLOCKS = 100
SAMPLE_SECONDS = 600.0
#: The most searches, and trigrams of their terms, a sample keeps the count of
#: (`SearchSample.matching`).
SAMPLE_SEARCHES = 10_000
#: A trigram at either end of a term that this share of the catalog's models or more hold is
#: not asked of the trigram index (`index_part`): its list is a fifth of the catalog or more.
COMMON_TRIGRAM = 0.2
#: How sure the sample must be that a search with no filter has more matches than the
#: count's cap before its pages skip the count (`CappedPaginator.past_cap`): the normal
#: deviates of the one-sided bound `SearchSample.matches_floor` gives, 3. A search with no
#: more matches than the cap is put past it by about one sample in 740 (a sample is the
#: same blocks while the table keeps its size, so for that long), and then it says "200+"
#: for 51 to 200 models, on a first page that is full: fewer, and the walk counts them.
SURE_DEVIATES = 3.0
SAMPLE_SEED = 1
_sample: list[tuple[float, SearchSample]] = []
_table: list[tuple[float, int, float]] = []
#: What a process's sorted reads learned: a search (its filters, whatever its order and page)
#: has more matches than one of them read, and when. For `TABLE_SECONDS` its pages take that
#: as the least their estimate can be, so a search whose keys' blocks underestimate it (rows
#: a sync or a migration moved) walks from its second page view on instead of trying the
#: sorted read every time. At most `LEARNED_SEARCHES`, the oldest forgotten first.
_more_than: dict[CatalogQuery, tuple[float, int]] = {}
LEARNED_SEARCHES = 1000
_learning = threading.Lock()
#: The heap block of a row, read with the keys: where the scan found it.
BLOCK = RawSQL(
    f'("{HubModel._meta.db_table}".ctid::text::point)[0]::bigint',
    (),
    output_field=BigIntegerField(),
)


def table_blocks(refresh: bool = False) -> tuple[int, float]:
    """The catalog table's blocks now and its models per block (PostgreSQL's statistics), read
    at most every `TABLE_SECONDS` per process unless `refresh`."""
    now = time.monotonic()
    if _table and now - _table[0][0] < TABLE_SECONDS and not refresh:
        return _table[0][1], _table[0][2]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_size(oid) / current_setting('block_size')::int, "
            "reltuples / greatest(relpages, 1) FROM pg_class WHERE oid = %s::regclass",
            [HubModel._meta.db_table],
        )
        blocks, per_block = cursor.fetchone()
    _table[:] = [(now, int(blocks), float(per_block))]
    return int(blocks), float(per_block)


@dataclass(frozen=True, slots=True)
class SearchSample:
    """The searched text (`search_text`) of a sample of the catalog's listed models, one a
    model, with the table block each was read from and its words (`search_words`)."""

    texts: tuple[str, ...] = ()
    #: The table block of each of `texts`.
    blocks: tuple[int, ...] = ()
    #: The words of each of `texts` (the lexemes of `search_words`), each after a space (a
    #: lexeme holds none), or none read: one string a model, as PostgreSQL joins them, where
    #: a tuple of its words took 7.4 times the memory (1.17 MB against 157 KB for 640 models
    #: at 100,000) and parsing the `tsvector`'s text 5.8 ms.
    words: tuple[str, ...] = ()
    #: The share of the table's blocks the sample drew (1.0: all of them).
    fraction: float = 1.0
    #: `_tally`'s answers so far, by terms (a sample lives `SAMPLE_SECONDS`).
    _matched: dict[tuple[str, ...], tuple[int, int]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def models(self) -> int:
        return len(self.texts)

    def holding(self, text: str) -> float:
        """The share of its models whose text holds `text` (`matching`); 0 for an empty
        sample."""
        return self.matching([text]) / len(self.texts) if self.texts else 0.0

    def matching(self, terms: list[str], words: list[str] | None = None) -> int:
        """How many of its models hold every term and a word starting with every one of
        `words` (`_tally`)."""
        return self._tally(terms, words or [])[0]

    def matches_floor(self, terms: list[str], words: list[str] | None = None) -> float:
        """A floor under how many of the catalog's listed models hold every term, above the
        true number for about one sample in 740 (`SURE_DEVIATES`): the table's blocks that
        hold such a model.
        SYSTEM sampling draws each block with chance `fraction`, so the sampled blocks that
        hold one are a Poisson count with mean `fraction` times the table's; the floor is the
        one-sided lower bound of that mean (Wilson and Hilferty's), over `fraction`. A floor of
        blocks and not of models, because models sit in blocks together: an organisation's
        models were written together, and one sampled block can hold a dozen of them. With
        every block sampled, the models it holds."""
        matched, blocks = self._tally(terms, words or [])
        if self.fraction >= 1.0:
            return float(matched)
        if not blocks:
            return 0.0
        root = 1 - 1 / (9 * blocks) - SURE_DEVIATES / (3 * math.sqrt(blocks))
        return blocks * max(root, 0.0) ** 3 / self.fraction

    def _tally(self, terms: list[str], words: list[str]) -> tuple[int, int]:
        """How many of its models hold every term and a word starting with every one of
        `words` (as the word index finds a word term, `word_query`), and in how many blocks,
        counted once per sample and search (up to `SAMPLE_SEARCHES` of them; then counted
        again): 0.11 to 0.2 ms at 100,000 models, on every page of a search. Counted a model
        at a time: counting a term in the whole sample at once counted "qwen" three times a
        model (its repo id, family and model type), and two terms as the rarer one alone
        ("qwen gguf": 11% of the catalog where 2.7% hold both). A sample without words holds
        no model for a word."""
        key = (*terms, "", *words) if words else tuple(terms)
        tally = self._matched.get(key)
        if tally is None:
            found = list(range(len(self.texts)))
            for term in terms:  # the rarest first would read less; any order gives the same
                found = [i for i in found if term in self.texts[i]]
            for word in words:
                start = f" {word}"
                found = [i for i in found if i < len(self.words) and start in self.words[i]]
            tally = (len(found), len({self.blocks[i] for i in found}) if self.blocks else 0)
            if len(self._matched) >= SAMPLE_SEARCHES:
                self._matched.clear()
            self._matched[key] = tally
        return tally


def search_sample() -> SearchSample:
    """A sample of the catalog's listed models (`SearchSample`): those of `SAMPLE_BLOCKS` of the
    table's blocks, drawn by PostgreSQL (`TABLESAMPLE SYSTEM`: 600 to 770 at 100,000 models),
    read at most every `SAMPLE_SECONDS` per process; every model while the table has no more
    blocks than that. The same blocks each time while the table keeps its size (`REPEATABLE`),
    so they stay in PostgreSQL's buffers: 2 to 3 ms to read them there (45 ms the first time),
    where new blocks each time took 20 ms and more, 435 from disk (at 100,000 models)."""
    now = time.monotonic()
    if _sample and now - _sample[0][0] < SAMPLE_SECONDS:
        return _sample[0][1]
    blocks, _ = table_blocks()
    percent = min(100.0, 100.0 * SAMPLE_BLOCKS / max(blocks, 1))
    with connection.cursor() as cursor:
        # The models the catalog lists (`CatalogQuery._matching`): a repo the Hub never had is
        # not one of a search's matches.
        cursor.execute(
            f"SELECT {BLOCK.sql}, search_text, "
            "' ' || array_to_string(tsvector_to_array(search_words), ' ') "
            f'FROM "{HubModel._meta.db_table}" TABLESAMPLE SYSTEM (%s) REPEATABLE (%s) '
            "WHERE NOT (status = %s AND current_snapshot_id IS NULL)",
            [percent, SAMPLE_SEED, ModelStatus.MISSING],
        )
        read = [row for row in cursor.fetchall() if row[1]]
    sample = SearchSample(
        texts=tuple(text for _, text, _ in read),
        blocks=tuple(block for block, _, _ in read),
        words=tuple(words or "" for _, _, words in read),
        fraction=percent / 100,
    )
    _sample[:] = [(now, sample)]
    return sample


def index_part(term: str, sample: SearchSample) -> str | None:
    """The part of a text term (as `search_terms` writes it) that the trigram index is asked
    for (`HubModelQuerySet.having`'s `parts`), when it is shorter than the term: the term less
    the trigrams at either end that `COMMON_TRIGRAM` or more of the sample's models hold, the
    commoner end first, while one trigram is left. None when that is the whole term, for a
    term with a character that is neither a letter nor a digit (pg_trgm takes a trigram only
    inside a word), and without a sample.

    PostgreSQL's trigram index builds a search's candidates from the lists of all its
    trigrams, and a common trigram's list is long: at 100,000 models "corpus-199" (written
    "corpusƀ199") read the lists of "cor" … "sƀ1", each in half the models or more, to find
    757 candidates in 3.3 to 6.1 ms, where "ƀ199" alone found 978 in 0.3 (docs/dashboard.md,
    "A term's rare part asks the index")."""
    if not sample.models or not term.isalnum():
        return None
    start, end = 0, len(term)
    while end - start > 3:
        left = sample.holding(term[start : start + 3])
        right = sample.holding(term[end - 3 : end])
        if max(left, right) < COMMON_TRIGRAM:
            break
        if left >= right:
            start += 1
        else:
            end -= 1
    return term[start:end] if end - start < len(term) else None


def index_parts(terms: list[tuple[str, bool]]) -> tuple[str | None, ...]:
    """`index_part` of each of `terms` (None for a word): on PostgreSQL, by the catalog's
    sample (`search_sample`); elsewhere none."""
    if connection.vendor != "postgresql" or all(word for _, word in terms):
        return ()
    sample = search_sample()
    return tuple(None if word else index_part(term, sample) for term, word in terms)


def sampled_share(terms: list[str]) -> float | None:
    """The share of the catalog's models that hold every one of `terms` (as `search_terms`
    writes them, none matched against words), by its sample (`search_sample`): (matches + 1) /
    (sample + 2), so that a sample without a match reads as under its size's share, not as
    none. None without a sample or a term."""
    sample = search_sample()
    if not terms or not sample.models:
        return None
    return (sample.matching(terms) + 1) / (sample.models + 2)


def looks_rare(share: float | None, most: int, models: float) -> bool:
    """Whether a search's share of the catalog by its sample (`sampled_share`) puts fewer than
    `most` of its `models` among its matches."""
    return share is not None and models > 0 and share * models < most


def matches_estimate(blocks: list[int], table: int) -> float | None:
    """How many models match, from the blocks where a scan found its first `len(blocks)`:
    PostgreSQL reads a table's blocks in order (a bitmap scan from the first, a sequential scan
    from where the last one stopped, wrapping at the end), so they span about len(blocks) / N
    of the table. Dead rows spread through the table change nothing; dead rows in one place
    (a mass delete not yet vacuumed), or matches sparser at the table's start than further on
    (rows a sync rewrote elsewhere), count as blocks crossed and make the estimate low, so the
    page sorts where it should walk: the sorted read then stops at `break_even` matches.
    None when the blocks are not in that order (an index scan) or the table's size is
    unknown."""
    if len(blocks) < 2 or table <= 0:
        return None
    wraps = sum(1 for a, b in zip(blocks, blocks[1:], strict=False) if b < a)
    if wraps > 1 or (wraps == 1 and blocks[-1] >= blocks[0]):
        return None
    span = (blocks[-1] - blocks[0]) % table + 1
    return len(blocks) * table / span


def break_even(top: int, models: float, walk_ms: float = WALK_MS_PER_MODEL) -> float:
    """The number of matches at which reading every match and sorting them costs what walking
    the order's index costs to find the first `top` (`SORT_MS` + `SORT_MS_PER_MATCH` m against
    `walk_ms` top models / m): with fewer the sorted read is cheaper, with more the walk.
    About 1,240 for a first page at 100,000 models, 1,820 for the second; for a search alone,
    whose walk reads the order's covering index (`WALK_MS_PER_KEY`), about 670 and 1,000."""
    a, b, c = SORT_MS_PER_MATCH, SORT_MS, walk_ms * top * models
    return (math.sqrt(b * b + 4 * a * c) - b) / (2 * a)


@dataclass(frozen=True, slots=True)
class SortedRead:
    """A page read sorted from every match (`CappedPaginator.rare`): its number, the most
    matches the read could take, how many it found (up to `most` + 1) and, when no more than
    `most`, the page's rows (one more than a page holds, to know whether another follows)."""

    number: int
    most: int
    matches: int
    rows: list[CatalogRow]


class CatalogPage(Page):  # type: ignore[type-arg]
    """A page that knows whether another follows without a count (`more`: read one row past
    it), for searches counted only up to the cap."""

    def __init__(
        self, object_list: Any, number: int, paginator: CappedPaginator, more: bool
    ) -> None:
        super().__init__(object_list, number, paginator)
        self.more = more

    def has_next(self) -> bool:
        return self.more


class CappedPaginator(Paginator):  # type: ignore[type-arg]
    """The catalog's pages of `CatalogRow`s (`CatalogQuery.models()` read as its `columns`).

    First it reads the keys of at most `COUNT_CAP` + 1 matches, unordered (`keys`): their
    number is the count, so a broad search costs the same at 10,000 models as at 100,000;
    `capped` says the count is a floor, and then a page reads one row more than it shows to
    know whether another follows. Sorted by downloads, PostgreSQL walked the downloads index
    through every match up to the cap (13 to 19 ms for broad terms at 100,000 models, against 4
    to 7 ms for the same count unordered)."""

    def __init__(self, query: CatalogQuery, per_page: int):
        super().__init__((), per_page)
        del self.object_list  # built when first read (`object_list`)
        self.query = query

    @cached_property
    def object_list(self) -> QuerySet[HubModel]:  # type: ignore[override]
        """`query.models()`, built only where a page reads it: a search walked alone
        (`walked`) never does (building it cost about 0.2 ms)."""
        return self.query.models()

    @cached_property
    def found(self) -> list[tuple[int, int | None]]:
        """The keys of the first `COUNT_CAP` + 1 matches PostgreSQL finds, in no order, each with
        its heap block (PostgreSQL only; None elsewhere)."""
        if self.unfiltered:
            return [(pk, block) for pk, block in self._read_kept("found", COUNT_CAP + 1)]
        rows = self.object_list.order_by()
        if connection.vendor == "postgresql":
            return list(rows.values_list("pk", BLOCK)[: COUNT_CAP + 1])
        return [(pk, None) for pk in rows.values_list("pk", flat=True)[: COUNT_CAP + 1]]

    @cached_property
    def keys(self) -> list[int]:
        return [pk for pk, _ in self.found]

    @cached_property
    def count(self) -> int:
        if self.rare is not None:
            return min(self.rare.matches, COUNT_CAP + 1)
        if self.past_cap:
            return COUNT_CAP + 1  # or what its walk counted, when it came up short (`page`)
        if self.walked is not None:
            return min(len(self.walked), COUNT_CAP + 1)
        return len(self.keys)

    @cached_property
    def terms(self) -> list[str] | None:
        """The search's terms as `search_text` holds them, on PostgreSQL and in one of
        `SORTED_READ`'s orders, when there is one and each is tested on the text (not against
        words): what the sample can judge and the orders' covering indexes hold. Else None."""
        if connection.vendor != "postgresql" or self.query.sort not in SORTED_READ:
            return None
        read = self.written
        if not read or any(is_word for _, is_word in read):
            return None
        return [term for term, _ in read]

    @cached_property
    def share(self) -> float | None:
        """The search's share of the catalog by its sample (`sampled_share` of `terms`), read
        once for the rare check and the walk (80 to 120 µs at 100,000 models)."""
        return None if self.terms is None else sampled_share(self.terms)

    @cached_property
    def alone(self) -> bool:
        """A search alone: `terms`, and no filter. Its order's covering index (registry
        migration 0019) holds all it tests, so its walk reads keys and no row."""
        return self.terms is not None and self.unfiltered

    @cached_property
    def unfiltered(self) -> bool:
        """On PostgreSQL, the catalog with no filter and no setup, searched or not: its reads
        run the statements kept for its shape (`search_statement`)."""
        plain = CatalogQuery(q=self.query.q, sort="", page="")
        return connection.vendor == "postgresql" and self.matching == plain

    def _read_kept(self, read: str, *tail: int) -> list[tuple[Any, ...]]:
        """The rows of `read` for a search with no filter, by the statement kept for its
        shape (`search_statement`), with `tail` after its parameters."""
        if not self.unfiltered:
            raise ValueError(f"{self.query} has a filter: no kept statement reads it")
        return read_kept(search_statement(read, self.query.sort, self.kinds), self.values, *tail)

    @cached_property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of its terms (`term_kinds`): the shape of its kept statements."""
        return term_kinds(self.written, self.parts)

    @cached_property
    def written(self) -> list[tuple[str, bool]]:
        """The search's terms as `search_terms` writes them, read once a page."""
        return search_terms(self.query.q)

    @cached_property
    def parts(self) -> tuple[str | None, ...]:
        """The parts of its terms asked of the trigram index (`index_parts`), once a page."""
        return index_parts(self.written)

    @cached_property
    def values(self) -> dict[str, str]:
        """What the marks of its kept statements stand for (`term_values`), once a page: a
        page runs up to three of them."""
        return term_values(self.written, self.parts)

    @property
    def walk_ms(self) -> float:
        """What a walk costs a model (`WALK_MS_PER_KEY` for a search alone)."""
        return WALK_MS_PER_KEY if self.alone else WALK_MS_PER_MODEL

    @cached_property
    def past_cap(self) -> bool:
        """A search with no filter, in one of `SORTED_READ`'s orders, that the catalog's
        sample says surely has more matches than the count's cap
        (`SearchSample.matches_floor`) and that the sorted read does not take (`rare`; for a
        search with a word term, the sample's estimate past `break_even`): its page walks its
        order's index to the page's rows and no further (a search alone, its covering index;
        one with a word, the table), and it says "200+" without counting. Counting first read
        the index's lists of every term, however many models hold them: for "qwen gguf" at
        100,000 models (a tenth and a quarter of the catalog), 3.3 ms of an 11.4 ms page. A
        walk that comes up short has counted every match, and the page says how many."""
        if not self.unfiltered or self.query.sort not in SORTED_READ or self.rare is not None:
            return False
        texts = [term for term, word in self.written if not word]
        words = [term for term, word in self.written if word]
        if not words:
            return bool(texts) and search_sample().matches_floor(texts) > COUNT_CAP
        sample = search_sample()
        if sample.matches_floor(texts, words) <= COUNT_CAP:
            return False
        table, per_block = table_blocks()
        models = table * per_block
        share = (sample.matching(texts, words) + 1) / (sample.models + 2)
        top = self._number() * self.per_page + 1
        return share * models >= min(SORT_CAP, break_even(top, models))

    @cached_property
    def walked(self) -> list[int] | None:
        """For a search alone that the catalog's sample says is broad (`WALK_ALONE_SHARE` of
        its models or more), the keys of its first `COUNT_CAP` + 1 matches in the page's
        order, or up to the page asked for (`query.page`) when it lies past them: one walk of
        the order's covering index, which is also the count (no count first). None for any
        other search, and for one the sorted read takes (`rare`)."""
        if not self.alone or self.rare is not None or self.past_cap:
            return None
        if self.share is None or self.share < WALK_ALONE_SHARE:
            return None
        return [pk for (pk,) in self._read_kept("walk", self._walk_limit(), 0)]

    def _walk_limit(self) -> int:
        """How far `walked` reads: the count's cap, or the page asked for when past it."""
        return max(COUNT_CAP + 1, self._number() * self.per_page + 1)

    def _number(self) -> int:
        """The page asked for (`query.page`), as `page` will read it past the cap."""
        number = int(self.query.page) if self.query.page.isdigit() else 1
        return min(max(number, 1), MAX_PAGES)

    @cached_property
    def rare(self) -> SortedRead | None:
        """For a search that the catalog's sample says few models match (`looks_rare`: fewer
        than the sorted read may read), the page asked for (`query.page`) read from every
        match, sorted, with their number: one query, where counting first and then sorting
        built the search's bitmap twice (the trigram index's lists, most of either query: at
        100,000 models 1.5 ms each for "org-42", 2.7 for "corpus-199"). It reads at most the
        matches the sorted read may read (`sort_limit`'s `break_even`); past them the page
        walks (`page`), and the process remembers the search as `sort_limit` does. None for
        any other search, and where that limit would not reach past the count's cap (a small
        catalog, where counting first costs little)."""
        if self.terms is None:
            return None  # no term, or one matched against words: the sample cannot say
        learned = _more_than.get(self.matching)
        if learned is not None and time.monotonic() - learned[0] < TABLE_SECONDS:
            return None
        number = self._number()
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page + 1
        table, per_block = table_blocks()
        models = table * per_block
        # Against the walk through the table, even for a search alone: a search this call
        # lets go is counted first, and that count (the trigram index's lists again, 2 to 5
        # ms for a few hundred matches at 100,000 models) comes on top of the walk, so the
        # sorted read stays the cheaper up to about as many matches as before the walk got
        # its covering index (with the index-only walk's cost, "a dataset tag", 506 matches,
        # was counted first in one benchmark run: 13.9x the trivial view after a sync, where
        # the code before measured 10.3x).
        most = min(SORT_CAP, int(break_even(top, models)))
        if most <= COUNT_CAP or not looks_rare(self.share, most, models):
            return None
        matches, rows = self._sorted_page(bottom, top, most)
        return SortedRead(number, most, matches, rows)

    @cached_property
    def num_pages(self) -> int:
        """The pages there are, or when capped the most the pager offers."""
        return MAX_PAGES if self.capped else super().num_pages

    def page(self, number: Any) -> Page:  # type: ignore[type-arg]
        """The rows of page `number`. Under the cap they are the rows of `keys`, read by their
        key and sorted: searching again cost a narrow search at 100,000 models 1.5 ms of its
        4.6 in one process (its query built and compiled twice over, and planned with the
        search's estimates: PostgreSQL guesses 2% of the catalog matches a short word, and for
        a rare one it walked the downloads index through every model to fill a page, 70 ms).
        Over the cap, the page walks the order's index, or sorts the matches
        (`sort_limit`)."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page + 1  # past the cap, one row more: whether another follows
        rare = self.rare
        shown: list[CatalogRow] | None = None
        known = self._known_rows(number, bottom, top)
        if known is not None:
            shown = known
            if not self.capped:
                return Page(shown[: self.per_page], number, self)
        elif rare is not None:  # more matches than it may sort: the walk
            self._learn_more_than(rare.most)
        elif self.past_cap:
            if self.alone:
                shown = self._walked_rows(bottom, top)
            else:
                listing = self._read_kept("listing", top - bottom, bottom)
                shown = [CatalogRow.of(row) for row in listing]
            if len(shown) <= self.per_page and (shown or not bottom):  # every match: counted
                self.count = min(bottom + len(shown), COUNT_CAP + 1)
                self.__dict__.pop("num_pages", None)  # (Paginator's, from the count)
            if not self.capped:
                return Page(shown, number, self)
        elif self.capped:
            most = self.sort_limit(top)
            shown = None if most is None else self._sorted_rows(bottom, top, most)
            if shown is None and most is not None:
                self._learn_more_than(most)
        elif not self.keys:
            return Page([], number, self)  # nothing to read, nor a query to build
        else:
            shown = self._keyed_rows(self.keys, bottom, bottom + self.per_page)
            return Page(shown, number, self)
        if shown is None and self.alone:  # the keys from the order's covering index
            shown = self._walked_rows(bottom, top)
        elif shown is None and self.unfiltered:
            shown = [CatalogRow.of(row) for row in self._read_kept("listing", top - bottom, bottom)]
        elif shown is None:
            shown = self._rows(self.object_list, bottom, top)
        more = len(shown) > self.per_page and number < MAX_PAGES
        return CatalogPage(shown[: self.per_page], number, self, more)

    def _known_rows(self, number: int, bottom: int, top: int) -> list[CatalogRow] | None:
        """Rows `bottom` to `top` where the page's first query found them, or their keys, in
        order (`walked`, or `rare` within its limit); None where it did not."""
        if self.walked is not None:
            if top > len(self.walked) == self._walk_limit():  # a page the walk stopped short of
                return self._walked_rows(bottom, top)
            return self._keyed_rows(self.walked[bottom:top])
        rare = self.rare
        if rare is None or rare.matches > rare.most:
            return None
        if number != rare.number:  # past the last page: the last one
            return self._sorted_page(bottom, top, rare.most)[1]
        return rare.rows

    def sort_limit(self, top: int) -> int | None:
        """The most matches the sorted read may read for the first `top` rows of a search past
        the cap, when sorting every match looks cheaper than walking the order's index
        (`WALK_MS_PER_MODEL`, measured on the downloads index; the others cost the same a
        model); None when the walk does. The limit is where the walk becomes the cheaper
        (`break_even`, within `SORT_CAP`), so a low estimate costs at most that many matches
        read before the walk. Most of what it costs is building the search's bitmap, which
        the limit does not shorten: "qwen gguf" at 100,000 models (2,705 matches), its
        estimate forced to 1,000, took 28.6 to 29.7 ms a page against 30.3 to 30.8 reading
        on to `SORT_CAP`, and 18.1 to 20.4 walking at once (docs/dashboard.md, "When the
        estimate is low")."""
        blocks = [block for _, block in self.found if block is not None]
        if self.query.sort not in SORTED_READ or not blocks or len(blocks) < len(self.found):
            return None
        table, per_block = table_blocks()
        if max(blocks) >= table:  # the table grew since its size was read
            table, per_block = table_blocks(refresh=True)
        matches = matches_estimate(blocks, table)
        if matches is None or per_block <= 0:  # (<= 0: never analyzed)
            return None
        learned = _more_than.get(self.matching)
        if learned is not None and time.monotonic() - learned[0] < TABLE_SECONDS:
            matches = max(matches, learned[1] + 1)
        most = min(SORT_CAP, int(break_even(top, table * per_block, self.walk_ms)))
        return most if matches < most else None

    def _walked_rows(self, bottom: int, top: int) -> list[CatalogRow]:
        """Rows `bottom` to `top` of a search alone, walked in the page's order and read by
        key in one statement ("walked rows")."""
        statement = search_statement("walked rows", self.query.sort, self.kinds)
        walk = {**self.values, KEYS_LIMIT: top - bottom, KEYS_OFFSET: bottom}
        return [CatalogRow.of(row) for row in read_kept(statement, walk, top - bottom, 0)]

    @property
    def matching(self) -> CatalogQuery:
        """The search as far as its matches go: the same whatever its order and page."""
        return replace(self.query, sort="", page="")

    def _learn_more_than(self, read: int) -> None:
        with _learning:  # a web process's threads share what it learned
            _more_than.pop(self.matching, None)  # (re)inserted last: the newest
            _more_than[self.matching] = (time.monotonic(), read)
            while len(_more_than) > LEARNED_SEARCHES:
                del _more_than[next(iter(_more_than))]

    def _sorted_rows(self, bottom: int, top: int, most: int) -> list[CatalogRow] | None:
        """Rows `bottom` to `top` from every match, sorted (`_sorted_page`); None when there
        are more than `most`."""
        matches, rows = self._sorted_page(bottom, top, most)
        return None if matches > most else rows

    def _sorted_page(self, bottom: int, top: int, most: int) -> tuple[int, list[CatalogRow]]:
        """How many models match, up to `most` + 1, and, when no more than `most`, rows
        `bottom` to `top` of them, sorted (else none). One query reads the matches (the
        search's own, unordered, as the count reads them) into a materialized set, counts and
        sorts it; for a search with no filter the same statement reads the page's rows by key
        ("sorted rows"), with a filter a second one. The order is PostgreSQL's, as the walk's
        (ties by repo id in its collation), so a search pages the same whichever way each page
        was read. Sorting joined to the verdicts, 500 matches were a hash join over every
        verdict (23 ms), and asked as one sorted query PostgreSQL may walk the downloads index
        after all."""
        if self.unfiltered:
            statement = search_statement("sorted rows", self.query.sort, self.kinds)
            page = {**self.values, SORT_MOST: most, KEYS_LIMIT: top - bottom, KEYS_OFFSET: bottom}
            read = read_kept(statement, page, top - bottom, 0)
            rows = [CatalogRow.of(row[:-1]) for row in read if row[0] is not None]
            return int(read[0][-1]), rows
        matches = self.object_list.order_by().values_list(*SORTED_COLUMNS)
        sql, params = matches.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(
                sorted_read(sql, self.query.sort), (*params, most + 1, top - bottom, bottom)
            )
            count, keys = cursor.fetchone()
        return int(count), self._keyed_rows(list(keys)) if count <= most else []

    def _keyed_rows(
        self, keys: list[int], bottom: int = 0, top: int | None = None
    ) -> list[CatalogRow]:
        """Rows `bottom` to `top` of these keys, in the page's order (no query for none)."""
        if not keys:
            return []
        return [CatalogRow.of(row) for row in self.query.rows_by_key(keys, bottom, top)]

    def _rows(self, models: Any, bottom: int, top: int) -> list[CatalogRow]:
        values = models.values_list(*self.query.columns)[bottom:top]
        return [CatalogRow.of(row) for row in values]

    @property
    def capped(self) -> bool:
        return self.count > COUNT_CAP

    @property
    def shown_count(self) -> int:
        return min(self.count, COUNT_CAP)
