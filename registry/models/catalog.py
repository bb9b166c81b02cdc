"""The catalog: Hugging Face models, every version of their chat templates, where they came from."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, models, transaction
from django.db.models import F, Func, Q, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import (
    Cast,
    Coalesce,
    Concat,
    Least,
    Lower,
    Replace,
    StrIndex,
    Upper,
)
from django.db.models.lookups import Exact, GreaterThan
from django.utils import timezone

from checks.reports import VERDICT_LABELS
from checks.sources import FoundTemplates, TemplateSource, sha256_text

#: A Hub model id: `owner/name`, letters, digits, `-`, `_`, `.`; no `--`/`..`; 96 chars a part.
#: The look-ahead for `--` and `..` reads the id only (the owner, then owner/name), so the same
#: pieces also make `REPO_ID_INPUT_PATTERN`, where more may follow the id.
_NO_DOUBLES = r"(?!(?:[\w.-]*/)?[\w.-]*(?:--|\.\.))"
#: ASCII only, as the Hub's ids are (Python's `\w` would take any letter: "aéb/x" was tracked,
#: and no URL of the site could name it). An owner starts and ends with a letter or a digit; a
#: name may also start or end with an underscore.
_OWNER = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?"
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = rf"{_NO_DOUBLES}{_OWNER}/{_NAME}"
REPO_ID_RE = re.compile(rf"^{_REPO_ID}$")

#: A Hub page's address around a repo id, as a reader copies it from the browser: the site
#: (with or without its scheme), and after the id one of the repo's pages (`/tree/main`,
#: `/blob/main/config.json`, …), a query or a fragment; spaces and slashes around it. Inside
#: the address, no space or control character (listed as a range: engines differ on what
#: `\s` covers) and no NUL (a repo id field refuses one first, `NoNul`).
HUB_SITE = r"(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/"
HUB_PAGES = ("tree", "blob", "resolve", "raw", "commit", "commits", "discussions", "edit")
HUB_PAGE = r"(?:/(?:" + "|".join(HUB_PAGES) + r")(?:/[^?#\x00-\x20]*)?)?"
HUB_QUERY = r"(?:[?#][^\x00-\x20]*)?"
#: What `validate_repo_id` accepts, the id its one group: the API's schema gives clients this
#: very pattern (dashboard.api_schemas), so the two cannot disagree.
REPO_ID_INPUT_PATTERN = rf"^\s*/*(?:{HUB_SITE})?({_REPO_ID}){HUB_PAGE}/*{HUB_QUERY}\s*$"
_REPO_ID_INPUT_RE = re.compile(REPO_ID_INPUT_PATTERN)


def validate_repo_id(value: str) -> str:
    """The repo id, out of what was pasted (an id, or the address of one of its Hub pages);
    raises ValidationError with a one-line message."""
    found = _REPO_ID_INPUT_RE.match(value)
    if found:
        return found.group(1)
    # Refused: say what is wrong with the part that was meant as the id.
    text = value.strip().lstrip("/")
    text = re.sub(rf"^{HUB_SITE}", "", text, count=1)
    repo_id = re.split(r"[?#]", text, maxsplit=1)[0].strip("/")
    parts = repo_id.split("/")
    if len(parts) > 2 and parts[2] in HUB_PAGES:
        repo_id = "/".join(parts[:2])
    raise ValidationError(
        f"{value.strip()[:120]!r} is not a Hub model id ({_why_not(repo_id)})",
        code="invalid_repo_id",
    )


def _why_not(repo_id: str) -> str:
    """What is wrong with a name REPO_ID_RE refused, in the words of the Hub's own rules."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        return "expected owner/name"
    longest = max(parts, key=len)
    if len(longest) > 96:
        return f"{len(longest)} characters in one part, at most 96"
    odd = sorted({c for c in repo_id if not ((c.isascii() and c.isalnum()) or c in "-_./")})
    if odd:
        shown = " ".join(repr(c) for c in odd[:5])
        return f"only ASCII letters, digits, '-', '_' and '.'; not {shown}"
    if "--" in repo_id or ".." in repo_id:
        return "no '--' or '..'"
    owner = parts[0]
    if not all(c.isascii() and c.isalnum() for c in (owner[0], owner[-1])):
        return "the owner starts and ends with an ASCII letter or digit"
    return "the name may not start or end with '-' or '.'"


class Verdict(models.TextChoices):
    """A template's cache verdict (the check engine's vocabulary)."""

    PENDING = "pending", "Not checked yet"
    SAFE = "safe", VERDICT_LABELS["safe"]
    UNSAFE = "unsafe", VERDICT_LABELS["unsafe"]
    SAFE_WHERE_RENDERABLE = "safe_where_renderable", VERDICT_LABELS["safe_where_renderable"]
    ERROR = "error", VERDICT_LABELS["error"]


class TemplateVersionQuerySet(models.QuerySet["TemplateVersion"]):
    def get_or_create_for_text(self, text: str) -> tuple[TemplateVersion, bool]:
        """Deduplicate by SHA-256 of the exact UTF-8 bytes of the template."""
        size = len(text.encode("utf-8", "surrogatepass"))
        return self.get_or_create(sha256=sha256_text(text), defaults={"text": text, "size": size})


class TemplateVersion(models.Model):
    """One distinct chat template text; shared by every model and commit that uses it."""

    sha256 = models.CharField(max_length=64, unique=True)
    text = models.TextField()
    size = models.PositiveIntegerField()
    first_seen = models.DateTimeField(default=timezone.now)

    objects = TemplateVersionQuerySet.as_manager()

    def __str__(self) -> str:
        return self.sha256[:12]

    def snapshot_for(self, repo_id: str = "") -> TemplateSnapshot | None:
        """The snapshot this template is read with: `repo_id`'s when it uses this version
        (as default or named template), else the newest that does (fine-tunes share it)."""
        snapshots = (
            TemplateSnapshot.objects.filter(
                Q(default_template=self) | Q(named_templates__version=self)
            )
            .select_related("model")
            .order_by("-created_at", "-id")
        )
        found = snapshots.filter(model__repo_id=repo_id).first() if repo_id else None
        return found or snapshots.first()

    def special_tokens(self, repo_id: str = "") -> dict[str, str]:
        """The special tokens this template renders with (`snapshot_for`'s): one rule for the
        check and for the pair page that re-renders what the check saw."""
        snapshot = self.snapshot_for(repo_id)
        return snapshot.token_strings() if snapshot else {}


class ModelStatus(models.TextChoices):
    OK = "ok", "OK"
    GATED = "gated", "Gated"
    PRIVATE = "private", "Private"
    MISSING = "missing", "Missing"
    DISABLED = "disabled", "Disabled"
    NO_TEMPLATE = "no_template", "No chat template"
    BROKEN = "broken", "Broken"
    PENDING = "pending", "Not synced yet"


class ModelFormat(models.TextChoices):
    """What the repo holds: the format an engine loads (from its files, library and tags)."""

    SAFETENSORS = "safetensors", "safetensors"
    MLX = "mlx", "MLX"
    GGUF = "gguf", "GGUF"


class Drift(models.TextChoices):
    """A derivative's template against its nearest tracked base's (registry.derivatives)."""

    SAME = "same", "Same as the base's current template"
    OLDER = "older", "An older template of the base's"
    EDITED = "edited", "Edited from the base's"
    UNKNOWN = "unknown", "Not comparable yet"


class HubModelQuerySet(models.QuerySet["HubModel"]):
    def track(self, repo_id: str, via: str) -> tuple[HubModel, bool]:
        """Start tracking a repo (idempotent, and in any case: the Hub's ids are, and a second
        row in other letters would hide the first from every case-insensitive lookup); the
        next sync fills it in."""
        known = self.filter(repo_id__iexact=repo_id).order_by("id").first()
        if known is not None:
            return known, False
        try:
            with transaction.atomic():
                made = self.create(
                    repo_id=repo_id, author=repo_id.split("/", 1)[0], tracked_via=via
                )
        except IntegrityError:
            # Tracked in the meantime, in these letters or others (`one_model_per_repo_id`).
            return self.get(repo_id__iexact=repo_id), False
        return made, True

    def named(self, repo_id: str) -> HubModel | None:
        """The tracked model `repo_id`, exact, else in other letters (the Hub's ids are
        case-insensitive, and `track` keeps one row whatever the case); None if untracked."""
        return (
            self.filter(repo_id=repo_id).first()
            or self.filter(repo_id__iexact=repo_id).order_by("id").first()
        )

    def stalest(self) -> HubModelQuerySet:
        """Tracked Hub repos, the ones synced longest ago (or never) first."""
        return (
            self.filter(is_demo=False)
            .exclude(tracked_via="local")
            .order_by(F("last_synced_at").asc(nulls_first=True), "id")
        )

    def cache_safe(self) -> HubModelQuerySet:
        return self.filter(verdict=Verdict.SAFE)

    def search(self, query: str, *, scanned: bool = False) -> HubModelQuerySet:
        """Models whose repo id, family, model type or tags contain every term (any case).

        One generated column (`search_text`) holds all four, so one trigram index serves
        every term on PostgreSQL (dashboard migration 0005, built again by registry migration
        0018): `LIKE '%term%'` on it, the term written as the column is (`search_terms`). On
        PostgreSQL a term of one or two letters or digits matches the start of a word instead
        (`search_words`, dashboard migration 0006): "7b" finds "qwen2-7b", not "27b".

        `scanned`: each term found in the text as a scan reads it (`strpos`, the same matches
        as `LIKE '%term%'`), for a walk of an order's index, where the trigram index has no
        part. PostgreSQL's `LIKE` took 1.3 to 2.1 times as long (docs/dashboard.md,
        "Statements kept by shape, and a walk that finds a term with strpos").
        """
        return self.having(search_terms(query), scanned=scanned)

    def having(
        self,
        terms: list[tuple[str, bool]],
        *,
        scanned: bool = False,
        parts: Sequence[str | None] = (),
    ) -> HubModelQuerySet:
        """Models that hold each of `terms`, as `search_terms` writes them (`search`).

        `parts`: for a term (by its place), a part of it that the trigram index is asked for in
        place of the whole term, or None (the whole). Each model that holds the part is then
        tested for the whole term as a walk tests it (`strpos`): the same matches, where the
        index read the long lists of the term's common trigrams and found hardly fewer
        candidates (the catalog chooses the part: `dashboard.catalog.index_part`)."""
        found = self
        for i, (term, is_word) in enumerate(terms):
            part = parts[i] if i < len(parts) else None
            if is_word:
                # No trigram in one or two characters: the start of a word, from the word
                # index (dashboard migration 0006) rather than a scan of every row. The word
                # itself is asked for beside its prefix (the same matches): PostgreSQL
                # estimates a word from the column's statistics, but a prefix at a flat 2%
                # while they hold fewer than 100 common words (a small or uniform catalog).
                # Then it built the whole posting list to count "7b:*", a word in one model in
                # five (3.4 ms at 100,000 models); with the word's share it reads rows until
                # the cap (0.7).
                prefix = RawSQL(
                    "search_words @@ to_tsquery('simple', %s)",
                    (word_query(term),),
                    output_field=models.BooleanField(),
                )
                found = found.filter(Exact(prefix, True))
            elif scanned:
                found = found.filter(GreaterThan(StrIndex("search_text", Value(term)), 0))
            elif part is not None:
                found = found.filter(search_text__contains=part).filter(
                    GreaterThan(StrIndex("search_text", Value(term)), 0)
                )
            else:
                found = found.filter(search_text__contains=term)
        return found


#: The separators inside a repo id or a tag ("org-42", "qwen2.5", "license:mit"), each written
#: in `search_text` as a letter of its own, and a term the same way. pg_trgm splits a text into
#: words at anything but a letter or a digit and keeps only the trigrams inside a word, so with
#: the separators as they are "org-42" asked for the trigrams of "org" (in every model of an
#: organisation named so) and of "42", and PostgreSQL rechecked thousands of rows to find a few
#: hundred; written as letters, the trigrams that cross them ("gƀ4", "ƀ42") find those rows
#: alone (docs/dashboard.md, "Separators written as letters, and a rare search read once").
#: The letters are rare ones, and where one of them is in a model's text it is written as
#: `SEARCH_ESCAPE` (not a letter), so a term with a separator matches where the text has that
#: separator and nowhere else.
SEARCH_SEPARATORS = {"-": "ƀ", "_": "ƃ", ".": "ƅ", "/": "ƈ", ":": "ƌ"}
SEARCH_ESCAPE = "\ufffd"
#: A lower-cased term as `search_text` writes it (`search_key` is the database's side).
SEARCH_KEY = str.maketrans(
    {**dict.fromkeys(SEARCH_SEPARATORS.values(), SEARCH_ESCAPE), **SEARCH_SEPARATORS}
)


def search_key(text: Func) -> Func:
    """`text` (lower-cased) as `search_text` holds it: what `SEARCH_KEY` does to a term, as
    `replace()` calls (PostgreSQL and SQLite both have it; `translate()` is PostgreSQL's)."""
    for letter in SEARCH_SEPARATORS.values():
        text = Replace(text, Value(letter), Value(SEARCH_ESCAPE), output_field=models.TextField())
    for separator, letter in SEARCH_SEPARATORS.items():
        text = Replace(text, Value(separator), Value(letter), output_field=models.TextField())
    return text


def search_terms(query: str) -> list[tuple[str, bool]]:
    """What `HubModelQuerySet.search` asks for each term of `query`: the term as `search_text`
    holds it (`SEARCH_KEY`), or, on PostgreSQL, a word of one or two letters or digits to
    find at the start of a word (True)."""
    words = connection.vendor == "postgresql"
    terms = []
    for term in query.lower().split()[:SEARCH_TERMS]:
        if words and len(term) < SHORT_TERM and re.fullmatch(r"[a-z0-9]+", term):
            terms.append((term, True))
        else:
            terms.append((term.translate(SEARCH_KEY), False))
    return terms


def word_query(word: str) -> str:
    """The text search query of a word term (`search_terms`): the word, or a word it starts."""
    return f"{word} | {word}:*"


#: More words than this in one search add nothing but cost: the rest are ignored.
SEARCH_TERMS = 8
#: Terms shorter than a trigram match the start of a word (PostgreSQL) instead of anywhere.
SHORT_TERM = 3


class HubModel(models.Model):
    """A tracked Hugging Face model repository."""

    repo_id = models.CharField(max_length=200, unique=True)
    author = models.CharField(max_length=100, db_index=True)
    family = models.CharField(max_length=100, blank=True, db_index=True)
    status = models.CharField(
        max_length=20, choices=ModelStatus.choices, default=ModelStatus.PENDING, db_index=True
    )
    status_reason = models.TextField(blank=True)

    #: Indexed in the catalog's order (registry migration 0019), the one index on it.
    downloads = models.BigIntegerField(default=0)
    likes = models.IntegerField(default=0)
    tags = models.JSONField(default=list, blank=True)
    pipeline_tag = models.CharField(max_length=100, blank=True)
    library_name = models.CharField(max_length=100, blank=True)
    model_type = models.CharField(max_length=100, blank=True)
    architectures = models.JSONField(default=list, blank=True)
    #: Recurrent/SSM/linear-attention layers: the cache cannot be trimmed back to a prefix.
    is_hybrid = models.BooleanField(default=False, db_index=True)
    #: Sliding-window or chunked attention layers: the cache is trimmable only inside the window.
    has_sliding_window = models.BooleanField(default=False)
    quantization = models.CharField(max_length=100, blank=True)
    base_model = models.CharField(max_length=200, blank=True)
    #: safetensors, MLX or GGUF; empty when the files say none of these.
    format = models.CharField(max_length=12, choices=ModelFormat.choices, blank=True, db_index=True)
    #: For a derivative of a tracked base: how its template relates to the base's (stored so
    #: the catalog can filter on it); empty when no tracked base.
    drift = models.CharField(max_length=10, choices=Drift.choices, blank=True, db_index=True)
    #: For a GGUF repo: each GGUF file read, the template it embeds, or why it was not read
    #: ({path, id, size, status, template, reason, bytes}); registry.gguf_files.
    gguf_files = models.JSONField(default=list, blank=True)

    last_commit_sha = models.CharField(max_length=40, blank=True)
    last_commit_at = models.DateTimeField(null=True, blank=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    #: Indexed in the catalog's order on PostgreSQL (registry migration 0015).
    last_template_change_at = models.DateTimeField(null=True, blank=True)
    tracked_at = models.DateTimeField(default=timezone.now)
    is_demo = models.BooleanField(default=False)
    #: How it got here: "track", "api", "form", "watch", "webhook", "local".
    tracked_via = models.CharField(max_length=20, blank=True)
    #: Object ids of the template files at `last_commit_sha` (what the next sync compares).
    template_files = models.JSONField(default=dict, blank=True)
    #: The backfilled history reaches the repo's first commit (else it stops at the bound).
    history_complete = models.BooleanField(default=False)
    #: The head a first sync read alone (its template and verdict come first); the history
    #: before it waits for the backfill (`hub.backfill_history`). Empty: nothing waits.
    history_from = models.CharField(max_length=40, blank=True, db_index=True)
    #: Why the last sync attempt failed (Hub down, rate limited, …); empty after a success.
    sync_error = models.TextField(blank=True)
    #: When that attempt failed; None after a success.
    sync_failed_at = models.DateTimeField(null=True, blank=True)
    #: When the Hub first answered this repo's model info with a bare 404 (no `RepoNotFound`),
    #: with no answer about the repo since; None otherwise (`registry.sync.record_not_found`).
    not_found_since = models.DateTimeField(null=True, blank=True)
    #: What the catalog search looks in, kept by the database: repo id, family, model type and
    #: tags, lower-cased, the separators inside them written as letters (`SEARCH_SEPARATORS`),
    #: in one column (one trigram index on PostgreSQL).
    search_text = models.GeneratedField(
        expression=search_key(
            Lower(
                Concat(
                    F("repo_id"),
                    Value(" "),
                    F("family"),
                    Value(" "),
                    F("model_type"),
                    Value(" "),
                    Cast(F("tags"), models.TextField()),
                    output_field=models.TextField(),
                )
            )
        ),
        output_field=models.TextField(),
        db_persist=True,
    )

    current_snapshot = models.ForeignKey(
        "TemplateSnapshot", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: Denormalized from the current template's check, so the catalog needs no joins.
    verdict = models.CharField(
        max_length=32, choices=Verdict.choices, default=Verdict.PENDING, db_index=True
    )
    verdict_summary = models.TextField(blank=True)
    verdict_updated_at = models.DateTimeField(null=True, blank=True)
    #: The catalog's "Prompt reuse" column: the mean share of the next prompt a prefix cache
    #: keeps under the current default template's defaults (checks.digest), None until it is
    #: checked. On the model, not its catalog row, so that order has an index to walk (registry
    #: migration 0016). Written only by `registry.verdicts.refresh_verdicts`, with the row.
    reuse = models.FloatField(null=True, blank=True)

    objects = HubModelQuerySet.as_manager()

    class Meta:
        ordering = ["repo_id"]
        indexes = [
            # A base page lists the models whose card names it (`base_model__iexact`).
            models.Index(Upper("base_model"), name="hubmodel_base_model_upper"),
            # The catalog's author filter takes a name in any case (`author__iexact`).
            models.Index(Upper("author"), name="hubmodel_author_upper"),
            # None here for a card's base, a pasted repo id and an API path, found
            # case-insensitively (`repo_id__iexact`): on PostgreSQL the catalog's name order's
            # index serves them, its key starting with upper(repo_id) (registry migration
            # 0019; 0014's own index before it). Without one, a sequential scan (74 ms at
            # 100,000 models) on every derivative's sync and every derivative's model page.
            # The models whose last sync failed, few, for the pages' Hub banner
            # (`registry.sync_status.hub_unreachable`): without it, a web process scanned the
            # table every 30 s (110 to 135 ms at 100,000 models, on both cores).
            models.Index(
                fields=["sync_error"], name="hubmodel_sync_failing", condition=~Q(sync_error="")
            ),
        ]
        constraints = [
            # The Hub's ids are case-insensitive: one row per repo whatever its letters
            # (`track` looks up before it inserts, and this settles two at the same instant).
            # On lower(), which no query reads (ids are ASCII, so it is the same rule as
            # upper()): one on upper(repo_id) took the name order's walk off its covering
            # index (migration 0019), an index scan and a sort where it read the index alone.
            models.UniqueConstraint(Lower("repo_id"), name="one_model_per_repo_id"),
        ]

    def __str__(self) -> str:
        return self.repo_id

    @property
    def name(self) -> str:
        return self.repo_id.split("/", 1)[-1]


class SourceFile(models.TextChoices):
    """Which file of a repo the template came from (transformers 5.x precedence)."""

    CHAT_TEMPLATE_JINJA = "chat_template.jinja", "chat_template.jinja"
    ADDITIONAL = "additional_chat_templates", "additional_chat_templates/*.jinja"
    TOKENIZER_CONFIG = "tokenizer_config.json", "tokenizer_config.json"
    CHAT_TEMPLATE_JSON = "chat_template.json", "chat_template.json"
    LOCAL = "local", "imported folder"
    GGUF = "gguf", "embedded in the GGUF file"


class TemplateSnapshot(models.Model):
    """The templates of one repo at one commit: which file won, named templates, tokens."""

    model = models.ForeignKey(HubModel, on_delete=models.CASCADE, related_name="snapshots")
    commit_sha = models.CharField(max_length=40)
    committed_at = models.DateTimeField(null=True, blank=True)
    source_file = models.CharField(max_length=40, choices=SourceFile.choices)
    default_template = models.ForeignKey(
        TemplateVersion, on_delete=models.PROTECT, related_name="default_in"
    )
    special_tokens = models.JSONField(default=dict, blank=True)
    tokenizer_json_sha = models.CharField(max_length=64, blank=True)
    tokenizer_json_size = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["model", "commit_sha"], name="one_snapshot_per_commit")
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.model.repo_id}@{self.commit_sha[:8]}"

    def template_names(self) -> list[str]:
        """The names of its named templates (none for a single template): one query."""
        return list(self.named_templates.values_list("name", flat=True))

    def token_strings(self) -> dict[str, str]:
        """The named special tokens, strings only (the JSON came from the Hub)."""
        tokens = self.special_tokens if isinstance(self.special_tokens, dict) else {}
        return {k: v for k, v in tokens.items() if isinstance(k, str) and isinstance(v, str)}

    def found_templates(self) -> FoundTemplates:
        """Its templates as a sync reads a commit's: what the next commit's are compared with.
        One query (the default template is read through `default_template`: select it with the
        snapshot)."""
        named = {n.name: n.version.text for n in self.named_templates.select_related("version")}
        return FoundTemplates(
            self.source_file, self.default_template.text, named, self.token_strings()
        )

    def template_source(self) -> TemplateSource:
        """Its templates as the engine takes a repo's (`FoundTemplates.source`): every named one
        by name, else the default alone, with its tokens."""
        return self.found_templates().source()


class NamedTemplate(models.Model):
    """A named chat template of a snapshot (`default`, `tool_use`, …)."""

    snapshot = models.ForeignKey(
        TemplateSnapshot, on_delete=models.CASCADE, related_name="named_templates"
    )
    name = models.CharField(max_length=100)
    version = models.ForeignKey(TemplateVersion, on_delete=models.PROTECT, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["snapshot", "name"], name="unique_template_name")
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.snapshot} {self.name}"


class TemplateChange(models.Model):
    """A commit where a repo's template changed: an event that checks and alerts consume."""

    model = models.ForeignKey(HubModel, on_delete=models.CASCADE, related_name="changes")
    commit_sha = models.CharField(max_length=40)
    committed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    title = models.CharField(max_length=500, blank=True)
    old_version = models.ForeignKey(
        TemplateVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    new_version = models.ForeignKey(
        TemplateVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: The templates at this commit (named templates, source file); None when removed.
    snapshot = models.ForeignKey(
        TemplateSnapshot, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    detected_at = models.DateTimeField(default=timezone.now)
    #: Found by the history backfill: old news, checked but not announced as an event.
    backfilled = models.BooleanField(default=False)
    #: Set by the one task that won the claim: UPDATE … WHERE claimed IS NULL.
    checks_claimed_at = models.DateTimeField(null=True, blank=True)
    alerts_claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["model", "commit_sha"], name="one_change_per_commit")
        ]
        ordering = ["-committed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.model.repo_id}@{self.commit_sha[:8]}"

    @property
    def dated(self) -> datetime:
        """When the change happened, for ordering across models: its commit's date, but never
        later than when a sync found it. A commit's date is whatever its author set: 50
        changes dated 2099 held the whole feed of changes, and the top of the catalog by last
        change. (`DATED` is the same in SQL.)"""
        found = self.detected_at or timezone.now()
        return min(self.committed_at, found) if self.committed_at else found


class WatchKind(models.TextChoices):
    AUTHOR = "author", "Author or organisation"
    QUERY = "query", "Hub query"


class WatchQuerySet(models.QuerySet["Watch"]):
    def covers_author(self, author: str) -> bool:
        return self.filter(kind=WatchKind.AUTHOR, author__iexact=author).exists()

    def stalest(self) -> WatchQuerySet:
        return self.order_by(F("last_run_at").asc(nulls_first=True), "id")


class Watch(models.Model):
    """A source of new repos: every model of an author, or the top N of a Hub query."""

    kind = models.CharField(max_length=10, choices=WatchKind.choices)
    author = models.CharField(max_length=100, blank=True)
    search = models.CharField(max_length=200, blank=True)
    pipeline_tag = models.CharField(max_length=100, blank=True)
    #: Hub tags every repo must carry, comma-separated (`filter=`), e.g. conversational.
    tags = models.CharField(max_length=200, blank=True)
    sort = models.CharField(max_length=40, default="downloads")
    limit = models.PositiveIntegerField(default=100)
    #: Made from the discovery settings (registry.discovery), not by hand.
    discovery = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    objects = WatchQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "author", "search", "pipeline_tag", "tags", "sort", "limit"],
                name="unique_watch_query",
            )
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        if self.kind == WatchKind.AUTHOR:
            return f"author {self.author}"
        parts = [
            f"search={self.search!r}" if self.search else "",
            self.pipeline_tag,
            f"tagged {self.tags}" if self.tags else "",
        ]
        return f"top {self.limit} by {self.sort} " + " ".join(p for p in parts if p)

    def query(self) -> dict[str, str | int | None]:
        """The Hub query this watch stands for (HubClient.iter_models arguments)."""
        return {
            "author": self.author or None,
            "search": self.search or None,
            "pipeline_tag": self.pipeline_tag or None,
            "tags": self.tags or None,
            "sort": self.sort,
            "limit": self.limit,
        }


class DiscoveryRun(models.Model):
    """One run of discovery (registry.discovery): the Hub queries asked, what they found, and
    what was new; the new repos' first syncs are the progress the site shows."""

    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    #: "command", "button" or "schedule".
    trigger = models.CharField(max_length=20)
    #: Repos the queries listed, and how many of them were not tracked before.
    listed = models.PositiveIntegerField(default=0)
    new = models.PositiveIntegerField(default=0)
    new_repo_ids = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"discovery {self.pk} ({self.trigger}, {self.started_at:%Y-%m-%d %H:%M})"


class TokenizerFile(models.Model):
    """A repo's tokenizer.json, fetched once per distinct file for token-level checks."""

    #: The Hub's id of the file (as TemplateSnapshot.tokenizer_json_sha records it).
    sha = models.CharField(max_length=64, unique=True)
    size = models.BigIntegerField()
    text = models.TextField()
    fetched_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"tokenizer.json {self.sha[:12]} ({self.size:,} bytes)"


#: `TemplateChange.dated` as an expression, to order changes by in the database.
DATED = Least(Coalesce("committed_at", "detected_at"), "detected_at")
