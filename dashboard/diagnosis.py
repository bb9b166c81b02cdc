"""Diagnose a reader's pasted requests against a tracked model's template or a pasted one.

Nothing is stored: the requests and the answer live for one request/response (docs/diagnose.md).
Rendering happens in the web process's sandbox worker (the template and the requests are a
stranger's), within a CPU budget and a wall-time guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from checks import RequestError, TemplateSource, diagnose_requests, parse_text
from checks.diagnose import ClientRequest, parse_body
from checks.sandbox import SandboxError
from checks.sources import SourceError, sha256_text
from registry.models import HubModel, validate_repo_id

from .pairs import RENDER_SECONDS, _pool

#: What a page or an API call may paste: bodies and template together.
MAX_PASTE_CHARS = 2 * 1024 * 1024
MAX_TEMPLATE_CHARS = 256 * 1024
MAX_PASTED_REQUESTS = 200


class DiagnosisError(ValueError):
    """Bad input, said in one sentence, with the HTTP status it deserves."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Diagnosis:
    template: str  # "repo_id" or "pasted template"
    template_sha256: str
    requests: int
    pairs: list[dict[str, Any]]
    error: str | None = None  # the template could not render these requests


def template_source(repo_id: str, template: str) -> tuple[TemplateSource, str]:
    """A tracked model's current templates (every named one), or a pasted one."""
    if template.strip():
        if len(template) > MAX_TEMPLATE_CHARS:
            raise DiagnosisError(f"the template is over {MAX_TEMPLATE_CHARS:,} characters", 413)
        try:
            return TemplateSource({"default": template}, origin="pasted"), "pasted template"
        except SourceError as exc:
            raise DiagnosisError(str(exc)) from None
    if not repo_id.strip():
        raise DiagnosisError("no template to render with: give a tracked model or paste one", 404)
    try:
        # The track form's rules (a pasted Hub URL works). The API's schema has applied them
        # already; the page's form has not.
        repo_id = validate_repo_id(repo_id)
    except ValidationError as exc:
        raise DiagnosisError(exc.messages[0]) from None
    model = (
        HubModel.objects.filter(repo_id__iexact=repo_id)
        .select_related("current_snapshot__default_template")
        .first()
    )
    if model is None:
        raise DiagnosisError(
            f"the model {repo_id} is not tracked: track it first, or paste its template", 404
        )
    snapshot = model.current_snapshot
    if snapshot is None:
        raise DiagnosisError(f"{model.repo_id} has no chat template yet", 404)
    # Every named template, as the CLI reads the repo's folder: a request renders with the one
    # transformers picks (`tool_use` for one that passes tools).
    return snapshot.template_source(), model.repo_id


def diagnose(requests: str | list[Any], *, repo_id: str = "", template: str = "") -> Diagnosis:
    """Pasted JSON Lines (or a JSON list), or already-parsed bodies, diagnosed pair by pair."""
    if isinstance(requests, str):
        if len(requests) > MAX_PASTE_CHARS:
            raise DiagnosisError(f"the requests are over {MAX_PASTE_CHARS:,} characters", 413)
        try:
            parsed: list[ClientRequest] = parse_text(requests, "requests")
        except RequestError as exc:
            raise DiagnosisError(str(exc)) from None
    else:
        try:
            parsed = [parse_body(b, f"request {n}") for n, b in enumerate(requests, start=1)]
        except RequestError as exc:
            raise DiagnosisError(str(exc)) from None
    if len(parsed) < 2:
        raise DiagnosisError("give at least two requests, in the order they were sent")
    if len(parsed) > MAX_PASTED_REQUESTS:
        raise DiagnosisError(
            f"{len(parsed)} requests: at most {MAX_PASTED_REQUESTS} here (the CLI takes more)", 413
        )
    source, name = template_source(repo_id, template)
    try:
        pairs = diagnose_requests(
            source,
            parsed,
            pool=_pool(),
            cpu_seconds=RENDER_SECONDS,
            wall_seconds=8 * RENDER_SECONDS * max(1, len(parsed) // 20),
        )
    except SandboxError as exc:  # the template's failure is the answer, not the request's fault
        return Diagnosis(
            name,
            source.sha256 or sha256_text(template),
            len(parsed),
            [],
            f"the template failed on these requests: {exc}",
        )
    return Diagnosis(name, source.sha256 or sha256_text(template), len(parsed), pairs)
