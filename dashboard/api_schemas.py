"""The JSON API's request and response shapes: one declaration, from which django-ninja both
validates what comes in and writes `/api/openapi.json`.

Responses forbid unknown fields on purpose: a builder in api.py (or `registry.api.model_json`)
that grows a field without growing its schema here fails the API tests instead of the schema
drifting from the code again. Timestamps and URLs stay the strings the builders make
(`isoformat()`, absolute URLs); the schema only names their format.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from django.core.exceptions import ValidationError
from django.db import models
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from checks.clients import PROFILE_NAMES
from checks.reuse import CACHE_CLASSES
from checks.setups import THINKING_CHOICES as SETUP_THINKING
from checks.setups import setup_value
from registry.models import (
    REPO_ID_INPUT_PATTERN,
    CheckStatus,
    ModelStatus,
    ProbeState,
    ProbeStatus,
    ProbeVerdict,
    Thinking,
    Tools,
    Verdict,
    validate_repo_id,
)

from .catalog import (
    COUNT_CAP,
    DRIFT_CHOICES,
    FORMAT_CHOICES,
    HYBRID_CHOICES,
    MAX_PAGES,
    SORTS,
    THINKING_CHOICES,
)

#: A NUL character never reaches a query: PostgreSQL refuses it in text (psycopg.DataError).
#: Paths and bodies with one are refused (400); query text loses it (DropNul).
NO_NUL_PATTERN = r"^[^\x00]*$"
#: One half of a Hub repo id, as long as the registry keeps one (`REPO_ID_RE`: 96).
REPO_PART_MAX = 100


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


class _NoNul:
    """`Annotated[str, NoNul]`: a string with a NUL is refused, with a message that says so
    (the schema's pattern says the same to clients; its own message would be cryptic)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(_no_nul, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["pattern"] = NO_NUL_PATTERN
        return json_schema


NoNul = _NoNul()


def _drop_nuls(value: str) -> str:
    return value.replace("\x00", "")


#: Query text loses its NULs instead, as on every page of the site (cachesafe.middleware drops
#: them from query strings before any view runs; this keeps the API so without it).
DropNul = AfterValidator(_drop_nuls)


class _HubRepoId:
    """`Annotated[str, HubRepoId]`: a Hub model id as `validate_repo_id` takes it (and
    normalizes it to `owner/name`), described by REPO_ID_INPUT_PATTERN. `HubRepoIdOrBlank` also
    lets a blank string through, as "" (a field a client may send empty)."""

    def __init__(self, *, blank: bool = False) -> None:
        self.blank = blank

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        check = _repo_id_or_blank if self.blank else _repo_id
        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["pattern"] = (
            rf"^\s*$|{REPO_ID_INPUT_PATTERN}" if self.blank else REPO_ID_INPUT_PATTERN
        )
        return json_schema


def _repo_id(value: str) -> str:
    try:
        return validate_repo_id(value)
    except ValidationError as err:
        raise ValueError(err.messages[0]) from err


def _repo_id_or_blank(value: str) -> str:
    return _repo_id(value) if value.strip() else ""


HubRepoId = _HubRepoId()
HubRepoIdOrBlank = _HubRepoId(blank=True)
#: Text from a client (query, path, body): any string but one with a NUL, refused with a 400.
Text = Annotated[str, NoNul]
RepoPart = Annotated[str, Field(max_length=REPO_PART_MAX), NoNul]
DateTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
Url = Annotated[str, WithJsonSchema({"type": "string", "format": "uri"})]


class OneOf:
    """`Annotated[str, OneOf(values)]`: a string that must be one of `values`, listed as the
    schema's enum. The values come from the models' choices and the catalog's, so the API
    accepts exactly what the catalog filters on; `blank` adds "" (a query parameter left
    blank, the same as left out)."""

    def __init__(self, values: Iterable[str], *, blank: bool = False) -> None:
        self.values = [str(v) for v in values] + ([""] if blank else [])

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.literal_schema(self.values)


def _choices(choices: type[models.TextChoices], *, blank: bool = False) -> OneOf:
    return OneOf(choices.values, blank=blank)


class Strict(BaseModel):
    """A response object: every field the builders write, and no other.

    A pydantic model, not a django-ninja `Schema`: a `Schema` with `extra="forbid"` validates
    each object twice, the second time through `DjangoGetter`, which reads every field with
    `getattr`. The builders write plain values, so that adapter has nothing to do: it took
    about a third of the model list's time (50 rows)."""

    model_config = ConfigDict(extra="forbid")


# Errors -----------------------------------------------------------------------------------


class ErrorDetail(Strict):
    code: str = Field(
        description="Stable, for programs: invalid_request, invalid_json, forbidden, not_found, "
        "method_not_allowed, payload_too_large, unsupported_media_type, rate_limited, "
        "internal_error, service_unavailable."
    )
    message: str = Field(description="For people: what was wrong, in one line.")


class ErrorResponse(Strict):
    """Every error answer of the API, whatever its status."""

    error: ErrorDetail


# Requests ---------------------------------------------------------------------------------
# Plain pydantic models, not ninja's Schema: that one also reads attributes off any object, so
# a JSON array would pass for an object with only optional fields.


def _drop_null(schema: dict[str, Any]) -> None:
    """`anyOf: [X, null]` → X, for each property (see CatalogFilters)."""
    for prop in schema.get("properties", {}).values():
        branches = [b for b in prop.pop("anyOf", []) if b.get("type") != "null"]
        if len(branches) == 1:
            prop.update(branches[0])
        elif branches:
            prop["anyOf"] = branches


class QueryParams(BaseModel):
    """Query parameters. Each may be left out, but a query string cannot say null: the schema
    lists no null. A choice may also be blank, meaning the same as left out, as on the catalog
    page, whose form sends `client=` for the typical client: a script that builds its URL from
    that form gets the same answer, not a 400."""

    model_config = ConfigDict(json_schema_extra=lambda schema: _drop_null(schema))


#: A part of the reader's setup (`client`, `engine`, `thinking`) is read as every surface reads
#: it (`checks.setups.setup_value`: the whitespace around it dropped), then matched exactly.
SetupPart = BeforeValidator(setup_value)


class SetupParams(QueryParams):
    """The reader's setup (the model page takes the same): each left out takes the headline's."""

    client: Annotated[str, OneOf(PROFILE_NAMES, blank=True), SetupPart] | None = Field(
        None, description="Client profile; default: typical (drops reasoning)"
    )
    engine: Annotated[str, OneOf(CACHE_CLASSES, blank=True), SetupPart] | None = Field(
        None, description="Engine cache class; default: trimmable"
    )
    thinking: Annotated[str, OneOf(SETUP_THINKING, blank=True), SetupPart] | None = Field(
        None, description="Template setting: default, off or on (enable_thinking)"
    )


class CatalogFilters(QueryParams):
    """The catalog's query parameters (the page at `/` takes the same ones)."""

    q: Annotated[str, Field(max_length=200), DropNul] | None = Field(
        None, description="Words to find in repo id, author, family, tags"
    )
    verdict: Annotated[str, _choices(Verdict, blank=True)] | None = Field(
        None, description="Verdict"
    )
    thinking: Annotated[str, OneOf(THINKING_CHOICES, blank=True), SetupPart] | None = Field(
        None,
        description="safe_on, safe_off (cache-safe with thinking on/off), none (no switch), "
        "same or differs (the verdict does / does not depend on it); default, off or on: the "
        "template setting of your setup (verdict and rows follow it)",
    )
    client: Annotated[str, OneOf(PROFILE_NAMES, blank=True), SetupPart] | None = Field(
        None, description="Your client profile: verdict and rows follow this setup"
    )
    engine: Annotated[str, OneOf(CACHE_CLASSES, blank=True), SetupPart] | None = Field(
        None, description="Your engine cache class: verdict and rows follow this setup"
    )
    hybrid: Annotated[str, OneOf(HYBRID_CHOICES, blank=True)] | None = Field(
        None, description="yes: hybrid (recurrent) models only; no: attention only"
    )
    format: Annotated[str, OneOf(FORMAT_CHOICES, blank=True)] | None = Field(
        None, description="What the repo holds: safetensors, mlx or gguf"
    )
    drift: Annotated[str, OneOf(DRIFT_CHOICES, blank=True)] | None = Field(
        None,
        description="A derivative's template against its tracked base's: differs (older or "
        "edited), older, edited, same",
    )
    tools: Annotated[str, _choices(Tools, blank=True)] | None = Field(
        None, description="Tool calling"
    )
    probe: Annotated[str, _choices(ProbeStatus, blank=True)] | None = Field(
        None, description="none (never probed) or the latest probe's verdict"
    )
    author: Annotated[str, Field(max_length=100), DropNul] | None = Field(
        None, description="Author (owner), in any case"
    )
    sort: Annotated[str, OneOf(SORTS, blank=True)] | None = Field(
        None, description="Default: downloads"
    )
    page: int | None = Field(
        None, ge=1, le=1_000_000, description="Page number, 50 models per page"
    )


class TrackRequest(BaseModel):
    repo_id: Annotated[str, Field(max_length=300), NoNul, HubRepoId] = Field(
        description="owner/name, or the address of one of the model's Hub pages (https://huggingface.co/…)",
        examples=["Qwen/Qwen3-8B"],
    )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Annotated[str, Field(min_length=1, max_length=40)]
    content: str | list[dict[str, Any]] | None = None


class ChatRequestBody(BaseModel):
    """An OpenAI chat-completions or Anthropic messages request body (other keys are kept)."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DiagnoseRequest(BaseModel):
    """Two or more request bodies a client sent, in order, and the template to render them with."""

    requests: list[ChatRequestBody] = Field(
        min_length=2,
        max_length=200,
        description="OpenAI chat-completions or Anthropic messages request bodies, in order",
    )
    repo_id: Annotated[str, Field(max_length=300), NoNul, HubRepoIdOrBlank] | None = Field(
        None,
        description="a tracked model whose current template renders them: owner/name, or the "
        "address of one of the model's Hub pages (https://huggingface.co/…)",
    )
    template: Annotated[str, Field(max_length=256 * 1024)] | None = Field(
        None, description="or a chat template (Jinja) pasted whole"
    )


class DiagnosedPair(Strict):
    from_: int = Field(alias="from")
    to: int
    prompt_reuse: float = Field(description="share of the next prompt a prefix cache keeps")
    cause: str = Field(
        description="none, system_changed, tools_changed, history_edited, reasoning_dropped, "
        "history_truncated, kwargs_changed or template"
    )
    where: dict[str, Any] = Field(description="message, field, offset, before, after (visible)")
    hint: str
    detail: str
    unit: str
    reused: int
    next_size: int


class Diagnosis(Strict):
    template: str
    template_sha256: str
    requests: int
    pairs: list[DiagnosedPair]
    error: str | None = Field(
        None, description="the template could not render these requests (then no pairs)"
    )


class HookEvent(BaseModel):
    model_config = ConfigDict(extra="allow")

    action: str | None = None
    scope: str | None = Field(None, description="repo.content, discussion, …")


class HookRepo(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str | None = Field(None, description="model, dataset or space")
    name: Annotated[str, Field(max_length=300), NoNul, HubRepoId] = Field(description="owner/name")
    headSha: str | None = None  # the Hub's own spelling


class HubWebhook(BaseModel):
    """The part of a Hub webhook payload we read; everything else is accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    event: HookEvent | None = None
    repo: HookRepo


# Responses --------------------------------------------------------------------------------

VerdictName = Annotated[str, _choices(Verdict)]


class ModelRow(Strict):
    repo_id: str
    author: str
    family: str
    status: Annotated[str, _choices(ModelStatus)]
    verdict: VerdictName
    summary: str
    thinking: Annotated[str, _choices(Thinking)] | None
    thinking_off: VerdictName | None
    thinking_on: VerdictName | None
    tools: Annotated[str, _choices(Tools)] | None
    probe: Annotated[str, _choices(ProbeStatus)]
    reuse: float | None = Field(
        None,
        description="mean share of the next prompt a prefix cache keeps, over every request "
        "pair of the conversations replayed, with the template's defaults (sort=reuse)",
    )
    is_hybrid: bool
    format: str = Field(description="safetensors, mlx, gguf, or empty when unknown")
    base_model: str = Field(description="The base its model card names (may be untracked)")
    drift: str = Field(
        description="same, older, edited or unknown against the tracked base; empty without one"
    )
    downloads: int
    last_template_change_at: DateTime | None
    url: Url
    setup_verdict: str | None = Field(
        None,
        description="with ?client=, ?engine= or ?thinking=on|off|default: that setup's verdict",
    )


class ModelList(Strict):
    count: int = Field(
        description=f"the matches, counted up to {COUNT_CAP}; past that it is {COUNT_CAP} and "
        "count_exact is false (a search that broad is refined, not paged through)"
    )
    count_exact: bool = Field(description="false when there are more matches than count")
    page: int
    pages: int = Field(
        description=f"the pages of count; {MAX_PAGES} when count_exact is false, and next is "
        "given while a page is full"
    )
    next: Url | None
    previous: Url | None
    results: list[ModelRow]


class ClientVerdict(Strict):
    """One client profile under one setting: its verdict per engine cache class."""

    profile: str = Field(
        description="typical, reasoning_content, thinking_chunks, arguments_objects, "
        "arguments_strings"
    )
    verdict: str | None = Field(description="on a trimmable cache; null: does not apply")
    note: str
    engines: dict[str, str] = Field(
        description="trimmable, block, hybrid, hybrid_checkpoints -> verdict"
    )
    reuse_share: dict[str, float | None]
    reply_reused: bool | None
    reply_units: float | None
    unit: str = Field(description="tokens or bytes")


class Variant(Strict):
    key: str
    label: str
    template_name: str
    kwargs: dict[str, Any]
    verdict: str
    mean_reusable_share: float | None
    clients: list[ClientVerdict] = Field(
        default_factory=list, description="the typical client first (its verdict is `verdict`)"
    )


class Failure(Strict):
    """A request pair that breaks (fail) or strains (warn) the cache."""

    variant: str
    session: str
    request_index: int
    status: str = Field(
        description="fail (the prompt breaks), reply (the reply is re-read) or warn"
    )
    cause: str | None = Field(
        description="history, generation_prompt, assistant_output, token_seam, …"
    )
    detail: str
    byte_offset: int | None
    token_index: int | None
    segment: str | None
    template_lines: list[int]
    reusable_share: float
    prompt_reuse: bool | None = None
    reply_reuse: bool | None = None
    diff_url: Url


class Finding(Strict):
    kind: str
    lines: list[int]
    message: str
    status: str


class Check(Strict):
    template_sha256: str
    engine_version: str
    status: Annotated[str, _choices(CheckStatus)]
    progress: int
    verdict: VerdictName
    summary: str
    finished_at: DateTime | None
    variants: list[Variant]
    failures: list[Failure]
    findings: list[Finding]


class TemplateUser(Strict):
    repo_id: str
    url: Url


class Template(Strict):
    sha256: str
    size: int
    first_seen: DateTime
    text: str
    url: Url
    check: Check | None
    models: list[TemplateUser]


class Probe(Strict):
    """One mlx-lm probe run on the Mac worker (its report is shown on the model page)."""

    id: int
    repo_id: str
    commit_sha: str
    state: Annotated[str, _choices(ProbeState)]
    verdict: Annotated[str, _choices(ProbeVerdict)] | None
    reused_share: float | None
    disagreement: bool
    error: str | None
    worker: str | None
    machine: dict[str, Any]
    queued_at: DateTime | None
    started_at: DateTime | None
    finished_at: DateTime | None
    page_url: Url


class WaitingProbe(Probe):
    position: int = Field(description="In the queue, from 1")


class RecentProbe(Probe):
    seconds: float | None = Field(description="On the Mac")


class Worker(Strict):
    online: bool
    detail: str
    since: DateTime | None


class ProbeQueue(Strict):
    worker: Worker
    queue_size: int
    waiting: list[WaitingProbe]
    recent: list[RecentProbe]


class TokenizerJson(Strict):
    sha: str
    size: int | None


class CurrentTemplate(Strict):
    sha256: str | None = Field(
        description="The default template's; null for named templates none of which is `default`"
    )
    source_file: str
    commit: str
    named_templates: dict[str, str]
    special_tokens: dict[str, Any]
    tokenizer_json: TokenizerJson | None


class TemplateChange(Strict):
    commit: str
    date: DateTime | None
    title: str
    template_sha256: str | None
    previous_sha256: str | None


class TrackedModel(Strict):
    """The registry's fields of a model (`registry.api.model_json`, docs/registry.md)."""

    repo_id: str
    author: str
    status: Annotated[str, _choices(ModelStatus)]
    status_reason: str
    sync_error: str
    #: When the attempt that left `sync_error` failed; null after a success.
    sync_failed_at: DateTime | None
    verdict: VerdictName
    verdict_summary: str
    downloads: int
    likes: int
    tags: list[str]
    pipeline_tag: str
    library_name: str
    model_type: str
    architectures: list[str]
    is_hybrid: bool
    has_sliding_window: bool
    quantization: str
    base_model: str
    format: str = Field(
        description="What the repo holds: safetensors, mlx or gguf; empty when its files say "
        "none of these"
    )
    drift: str = Field(
        description="A derivative's template against its tracked base's (same, older, edited, "
        "unknown); empty when no tracked base"
    )
    last_commit_sha: str | None
    last_commit_at: DateTime | None
    template: CurrentTemplate | None
    history: list[TemplateChange]
    history_complete: bool
    history_pending: bool = Field(
        description="A first sync read the head only: the history before it is being read"
    )


class CatalogVariant(Strict):
    key: str
    label: str
    verdict: str
    share: float | None


class SettingVerdict(Strict):
    label: str
    kwargs: dict[str, Any]
    verdict: str | None


class SetupVerdict(Strict):
    """The verdict for the reader's setup, and what to do about it."""

    client: str
    engine: str
    thinking: str
    verdict: str | None = Field(description="null: the client profile does not apply")
    setting: str = Field(description="the template setting the thinking choice selects")
    sentence: str
    settings: list[SettingVerdict] = Field(description="every setting for this client and engine")


class ModelDetail(TrackedModel):
    """The registry's fields, the current check, per-variant verdicts and the latest probe."""

    variants: list[CatalogVariant]
    setup: SetupVerdict | None = Field(
        description="the verdict for ?client=&engine=&thinking= (if none: the typical client "
        "on a trimmable cache with the template's defaults). The model's `verdict` counts every "
        "primary setting (enable_thinking off and on too), so the two can differ; the sentence "
        "then names the setting that breaks"
    )
    check: Check | None
    probe: Probe | None
    page_url: Url


class HookOutcome(Strict):
    """A webhook was taken: a sync of `queued` was queued, or nothing, because of `ignored`."""

    queued: str | None = None
    ignored: str | None = None
