"""The catalog's state, all of it in the query string: search, filters, sort, page."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db.models import F, Q, QuerySet
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.lookups import Exact
from django.http import QueryDict

from checks.clients import PROFILES
from checks.reuse import CACHE_CLASS_LABELS
from checks.setups import THINKING_DEFAULT, THINKING_OFF, THINKING_ON, THINKING_WORDS
from registry.models import (
    Drift,
    HubModel,
    ModelFormat,
    ProbeStatus,
    TemplateVersion,
    Thinking,
    Tools,
    Verdict,
)

PAGE_SIZE = 50

SORTS: dict[str, tuple[Any, ...]] = {
    "downloads": ("-downloads", "repo_id"),
    "reuse": (F("catalog_verdict__reuse").desc(nulls_last=True), "repo_id"),
    "changed": ("-last_template_change_at", "repo_id"),
    "name": ("repo_id",),
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
# The catalog needs only these columns; the rest of HubModel stays in the database.
LIST_FIELDS = (
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
    "last_synced_at",
    "sync_error",
    "catalog_verdict__thinking",
    "catalog_verdict__thinking_off",
    "catalog_verdict__thinking_on",
    "catalog_verdict__tools",
    "catalog_verdict__probe",
    "catalog_verdict__reuse",
)


def _choice(value: str | None, allowed: object) -> str:
    """An unknown filter value is ignored (an old or hand-edited link still shows something)."""
    value = (value or "").strip()
    return value if value and value in allowed else ""  # type: ignore[operator]


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

    @classmethod
    def ignored(cls, params: QueryDict) -> list[str]:
        """The `name=value` filters of a link that this catalog does not know (shown as
        ignored, so a mistyped or outdated link does not silently show everything)."""
        query = cls.from_params(params)
        dropped = []
        for name in FILTERS:
            given = (params.get(name) or "").strip()
            if given and given != getattr(query, name):
                dropped.append(f"{name}={given[:40]}")
        return dropped

    @classmethod
    def from_params(cls, params: QueryDict) -> CatalogQuery:
        return cls(
            q=params.get("q", "").strip()[:200],
            verdict=_choice(params.get("verdict"), Verdict.values),
            thinking=_choice(params.get("thinking"), THINKING_CHOICES),
            client=_choice(params.get("client"), CLIENT_CHOICES),
            engine=_choice(params.get("engine"), ENGINE_CHOICES),
            hybrid=_choice(params.get("hybrid"), HYBRID_CHOICES),
            format=_choice(params.get("format"), FORMAT_CHOICES),
            drift=_choice(params.get("drift"), DRIFT_CHOICES),
            tools=_choice(params.get("tools"), Tools.values),
            probe=_choice(params.get("probe"), ProbeStatus.values),
            author=params.get("author", "").strip()[:100],
            sort=_choice(params.get("sort"), SORTS) or "downloads",
            page=params.get("page", "1")[:10],
        )

    def models(self) -> QuerySet[HubModel]:
        """The matching models, sorted, with only the columns a catalog row shows."""
        # Repo id, family, tags, model type; the author is the repo id's first part.
        models = HubModel.objects.search(self.q)
        if self.setup_active:
            # The verdict for the reader's setup, from the catalog row's per-setup verdicts.
            thinking = self.thinking if self.thinking in SETUP_THINKING else THINKING_DEFAULT
            path = KeyTransform(
                self.client or "typical",
                KeyTransform(thinking, "catalog_verdict__setups"),
            )
            chosen = KeyTextTransform(self.engine or "trimmable", path)
            models = models.annotate(setup_verdict=chosen)
            if self.verdict:
                models = models.filter(Exact(chosen, self.verdict))
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
            models = models.filter(author=self.author)
        return (
            models.select_related("catalog_verdict").only(*LIST_FIELDS).order_by(*SORTS[self.sort])
        )

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
    def active(self) -> bool:
        return any(k != "page" and k != "sort" for k in self.params)


def models_using(version: TemplateVersion, limit: int = 200) -> QuerySet[HubModel]:
    """Models that have had this version as their default template, most downloaded first."""
    return (
        HubModel.objects.filter(snapshots__default_template=version)
        .distinct()
        .only("repo_id", "verdict", "downloads")
        .order_by("-downloads", "repo_id")[:limit]
    )


#: A catalog page counts matches up to this many; past it, it says "1,000+" (and pages through
#: the first thousand, 20 pages of 50: a search that broad is refined, not paged through).
#: Counting every match of a broad term ("chat" matches 49,000 of 100,000 models) cost more
#: than the rest of the page; counting to 10,000 still cost 5 to 7 ms there, to 1,000 1 to 3.
COUNT_CAP = 1_000


class CappedPaginator(Paginator):  # type: ignore[type-arg]
    """Counts at most `COUNT_CAP` + 1 rows (`SELECT COUNT(*) FROM (… LIMIT n)`), so a broad
    search costs the same at 10,000 models as at 100,000; `capped` says the count is a floor.

    The count drops the listing's order and columns: sorted by downloads, PostgreSQL walked the
    downloads index through every match up to the cap (13 to 19 ms for broad terms at 100,000
    models, against 4 to 7 ms for the same count unordered)."""

    @cached_property
    def count(self) -> int:
        rows: Any = self.object_list  # a QuerySet: sliced, it counts in a subquery
        return int(rows.order_by().values("pk")[: COUNT_CAP + 1].count())

    def page(self, number: Any) -> Page:  # type: ignore[type-arg]
        """The rows of page `number`. Under the cap they are read through the search's index
        and then sorted: PostgreSQL guesses 2% of the catalog matches a short word, and for a
        rare one it walked the downloads index through all 100,000 models to fill a page
        (70 ms, against 0.4). Over the cap, that walk is the fast plan (50 matches early)."""
        number = self.validate_number(number)
        rows: Any = self.object_list
        if not self.capped:
            rows = rows.filter(pk__in=rows.order_by().values("pk")[: COUNT_CAP + 1])
        bottom = (number - 1) * self.per_page
        top = min(bottom + self.per_page, self.count)  # no matches, no second query
        return Page(rows[bottom:top], number, self)

    @property
    def capped(self) -> bool:
        return self.count > COUNT_CAP

    @property
    def shown_count(self) -> int:
        return min(self.count, COUNT_CAP)
