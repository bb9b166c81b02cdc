"""The pages people see. Thin: fetch or 404, one or two calls, render."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_safe

from checks.clients import PROFILES
from checks.reports import RequestPair
from checks.reuse import CACHE_CLASS_LABELS, CACHE_CLASSES
from checks.setups import (
    SETUP_PARTS,
    THINKING_WORDS,
    Setup,
    SetupError,
    given_parts,
    is_chosen,
    setup_value,
    setup_verdict,
)
from checks.setups import (
    THINKING_CHOICES as SETUP_THINKING,
)
from checks.sources import has_default
from registry import derivatives
from registry.models import (
    HubModel,
    ModelStatus,
    NamedTemplate,
    ProbeStatus,
    TemplateSnapshot,
    TemplateVersion,
    Tools,
    Verdict,
)
from registry.verdicts import latest_check, model_check
from workers.health import cached_status
from workers.models import WorkerHeartbeat

from . import badges, diagnosis, history, status
from .catalog import (
    CLIENT_CHOICES,
    DRIFT_CHOICES,
    ENGINE_CHOICES,
    FORMAT_CHOICES,
    HYBRID_CHOICES,
    PAGE_SIZE,
    SORT_LABELS,
    THINKING_CHOICES,
    CappedPaginator,
    CatalogQuery,
    models_using,
    stored_setup_verdict,
)
from .discovery import discovery_context
from .htmx import HtmxHttpRequest
from .page_cache import cached_page, shows
from .pairs import PairUnavailable, pair_diff
from .probes import ProbeQueue, ProbeView, latest_probe
from .report_view import ReportView, model_sentence, model_setup_verdict, no_default_sentence
from .stored_reports import find_pair

#: The menus of the models' own choices, read once (`.choices` builds a list on every call).
VERDICT_CHOICES = Verdict.choices
TOOLS_CHOICES = Tools.choices
PROBE_CHOICES = ProbeStatus.choices


@require_safe
@cached_page
def catalog(request: HtmxHttpRequest) -> HttpResponse:
    """Every tracked model with its verdicts: search, filters, sort and page, all in the URL."""
    query = CatalogQuery.from_params(request.GET)
    ignored = query.ignored(request.GET)
    # A link with a value the catalog ignores keeps it, for the note that quotes it.
    moved = None if ignored else setup_address(request, query.setup_spelling)
    if moved is not None:
        return moved
    page = CappedPaginator(query, PAGE_SIZE).get_page(query.page)
    shows(request, (row.repo_id for row in page), reads_verdicts=query.reads_verdicts)
    context = {
        "page": page,
        "query": query,
        "ignored": ignored,
        "verdicts": VERDICT_CHOICES,
        "thinking_choices": THINKING_CHOICES.items(),
        "client_choices": CLIENT_CHOICES.items(),
        "engine_choices": ENGINE_CHOICES.items(),
        "tools_choices": TOOLS_CHOICES,
        "probe_choices": PROBE_CHOICES,
        "hybrid_choices": HYBRID_CHOICES.items(),
        "format_choices": FORMAT_CHOICES.items(),
        "drift_choices": DRIFT_CHOICES.items(),
        "sorts": SORT_LABELS.items(),
    }
    if request.htmx:
        return render(request, "dashboard/catalog_results.html", context, using="jinja2")
    context["show_discovery"] = not query.active and page.number == 1
    if context["show_discovery"]:
        # The landing page only: the demo notice and discovery's progress (three queries).
        context |= discovery_context()
    return render(request, "dashboard/catalog.html", context)


def _model_or_404(request: HttpRequest, org: str, name: str) -> HubModel:
    repo_id = f"{org}/{name}"
    model = HubModel.objects.select_related(
        "current_snapshot__default_template", "catalog_verdict"
    ).named(repo_id)
    if model is None:
        raise UnknownModel(repo_id)
    return model


class UnknownModel(Http404):
    """A repo id we do not track: the 404 page offers to track it."""

    def __init__(self, repo_id: str) -> None:
        super().__init__(f"{repo_id} is not tracked")
        self.repo_id = repo_id


def _unknown_model(request: HttpRequest, repo_id: str) -> HttpResponse:
    return render(request, "dashboard/unknown_model.html", {"repo_id": repo_id}, status=404)


def sync_requested_at(request: HttpRequest) -> datetime | None:
    """`?sync=<epoch seconds>`: when a staff member asked for a re-sync (shown to staff only)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_staff:
        return None
    try:
        return datetime.fromtimestamp(float(request.GET["sync"]), tz=UTC)
    except (KeyError, ValueError, OverflowError, OSError):
        return None


def page_url(request: HttpRequest, model: HubModel) -> str:
    """Where live partials poll: this page, or the model's page when a staff action answers."""
    if request.method == "GET":
        return request.path
    org, name = model.repo_id.split("/", 1)
    return reverse("dashboard:model", args=[org, name])


def setup_params(request: HttpRequest) -> str:
    """The setup the reader chose (?client=&engine=&thinking=) as its one query string
    (`Setup.query`), "" for none: what a link or a poll from this page keeps, so that it
    answers for the same setup."""
    return reader_setup(request)[0].query() if is_chosen(request.GET) else ""


def setup_address(request: HttpRequest, spelling: dict[str, str] | None) -> HttpResponse | None:
    """A permanent redirect to this page with its setup parts spelt `spelling` (the one
    spelling, `Setup.params`; {} for none), the rest of the query string as it was; None when
    they already are, or for `spelling` None. `?client=typical`, the model page's form's three
    values, or spaces from a pasted link would each be a page of their own, in the page cache
    (keyed by URL) as in shared links."""
    given = {part: request.GET[part] for part in SETUP_PARTS if setup_value(request.GET.get(part))}
    if spelling is None or given == spelling:
        return None
    query = request.GET.copy()
    for part in SETUP_PARTS:
        query.pop(part, None)
    query.update(spelling)
    encoded = query.urlencode()
    return HttpResponsePermanentRedirect(f"{request.path}?{encoded}" if encoded else request.path)


def probe_context(request: HttpRequest, model: HubModel) -> dict[str, Any]:
    run = latest_probe(model)
    probe = ProbeView.build(run) if run else None
    waiting = bool(probe and probe.waiting)
    return {
        "model": model,
        "probe": probe,
        "probe_polling": waiting,
        # Only asked while a probe waits: "waiting" means little if nobody will pick it up.
        "probe_worker_online": WorkerHeartbeat.objects.probe_worker_online() if waiting else None,
        "page_url": page_url(request, model),
    }


def model_context(
    request: HttpRequest,
    model: HubModel,
    snapshot: TemplateSnapshot | None,
    *,
    sync_since: datetime | None = None,
    named: list[NamedTemplate] | None = None,
) -> dict[str, Any]:
    """Everything the model page and its live partials show (`named`: the snapshot's named
    templates, when the caller has read them)."""
    check = model_check(snapshot) if snapshot else None
    view = ReportView.build(snapshot.default_template, check) if snapshot else None
    line = status.status_line(model, check, has_template=snapshot is not None)
    # Without a template the verdict sentence can only say why there is none: the sync's words
    # ("the Hub could not be reached …") beat the raw status reason or "no template found".
    sync_said = view is None and bool(line.sync.sentence)
    sentence = line.sync.sentence if sync_said else model_sentence(model, view)
    if named is None:
        names = snapshot.template_names() if snapshot else []
    else:
        names = [n.name for n in named]
    # Named templates none of which is `default`: no template's report speaks for the model.
    no_default = not has_default(names)
    if no_default and view is not None and view.report is not None:
        sentence = no_default_sentence(model, names)
    sync_since = sync_since or sync_requested_at(request)
    setup, setup_error = reader_setup(request)
    chosen = setup_verdict(view.report, setup) if view and view.report and not no_default else None
    return {
        **probe_context(request, model),
        "setup": setup,
        "setup_error": setup_error,
        "setup_verdict": chosen,
        "setup_choices": SETUP_CHOICES,
        "setup_chosen": is_chosen(request.GET),
        "setup_params": setup_params(request),
        "snapshot": snapshot,
        "check": check,
        "view": view,
        "no_default": no_default,
        "sentence": sentence,
        "status_line": line,
        "sync_said": sync_said,
        # Poll while a check (or the first sync) is under way; the last answer stops polling.
        "polling": view.checking if view else model.status == ModelStatus.PENDING,
        "sync_since": sync_since,
        "sync_param": f"{sync_since.timestamp():.6f}" if sync_since else "",
        # Synced after the request: the sync ran (or a scheduled one did the same work).
        "sync_done": bool(
            sync_since and model.last_synced_at and model.last_synced_at >= sync_since
        ),
        "og_title": f"{model.repo_id}: {model.get_verdict_display()}",
        "og_description": sentence,
    }


def lineage_context(model: HubModel) -> dict[str, Any]:
    """The model's bases (nearest first) and how its template relates to the nearest one's;
    the tracked models derived from it, each with the same comparison against this one."""
    chain = derivatives.bases(model)
    children = derivatives.derivatives(model)
    return {
        "bases": chain,
        "drift": derivatives.drift(model, chain[0]) if chain else None,
        "untracked_base": model.base_model if model.base_model and not chain else "",
        "derived": list(zip(children, derivatives.drifts(model, children), strict=True)),
    }


def gguf_context(model: HubModel, snapshot: TemplateSnapshot | None) -> list[dict[str, Any]]:
    """A GGUF repo's files as the page lists them: each one's embedded template, marked when it
    is not the template the verdict is about."""
    current = snapshot.default_template.sha256 if snapshot is not None else ""
    rows = []
    for entry in model.gguf_files if isinstance(model.gguf_files, list) else []:
        if not isinstance(entry, dict):
            continue
        template = str(entry.get("template") or "")
        rows.append(
            {
                "path": str(entry.get("path") or ""),
                "status": str(entry.get("status") or ""),
                "template": template,
                "differs": bool(template and current and template != current),
                "reason": str(entry.get("reason") or ""),
                "bytes": int(entry.get("bytes") or 0),
                "size": entry.get("size"),
            }
        )
    return rows


SETUP_CHOICES = {
    "client": [(p.name, p.label) for p in PROFILES],
    "engine": [(c, CACHE_CLASS_LABELS[c]) for c in CACHE_CLASSES],
    "thinking": [(t, THINKING_WORDS[t]) for t in SETUP_THINKING],
}


def reader_setup(request: HttpRequest) -> tuple[Setup, str]:
    """The setup in ?client=&engine=&thinking=; an unknown value is ignored and said so, and
    the others are kept (a link with one stale value still shows the reader's client)."""
    try:
        return Setup.parse(request.GET), ""
    except SetupError:
        pass
    kept: dict[str, str] = {}
    errors: list[str] = []
    for name, value in given_parts(request.GET).items():
        try:
            Setup.parse({name: value})
        except SetupError as exc:
            errors.append(str(exc))
        else:
            kept[name] = value
    return Setup.parse(kept), f"Ignored: {'; '.join(errors)}."


LIVE_PARTIALS = {"check-status", "probe-status", "sync-status"}


@require_safe
@cached_page
def model_detail(
    request: HtmxHttpRequest, org: str, name: str, commit: str | None = None
) -> HttpResponse:
    """A model's verdict, matrix, findings, template and history; pinned to a commit if given."""
    setup, setup_error = reader_setup(request)
    spelling = setup.params if is_chosen(request.GET) else {}
    # A value the page ignores stays in the URL, for the note that quotes it.
    moved = None if setup_error else setup_address(request, spelling)
    if moved is not None:
        return moved
    try:
        model = _model_or_404(request, org, name)
    except UnknownModel as exc:
        return _unknown_model(request, exc.repo_id)
    if model.repo_id != f"{org}/{name}":
        # The repo id in other letters (the Hub's ids are case-insensitive): its one address,
        # so that links and the page cache agree, with the rest of the URL kept.
        org, name = model.repo_id.split("/", 1)
        page = reverse("dashboard:model_at", args=[org, name, commit]) if commit else None
        page = page or reverse("dashboard:model", args=[org, name])
        query = request.META.get("QUERY_STRING", "")
        return HttpResponsePermanentRedirect(f"{page}?{query}" if query else page)
    target = request.htmx.target if request.htmx else None
    if target == "probe-status":
        # Polled every few seconds while a probe waits: only the probe, not the whole report.
        context = probe_context(request, model)
        response = render(request, "dashboard/model.html#probe-status", context)
        if context["probe_polling"]:
            response["Cache-Control"] = "no-store"
        return response
    snapshot: TemplateSnapshot | None = model.current_snapshot
    if commit is not None and len(commit) < 40:
        # A short commit id, as the page and the Hub print them: the one full id it names.
        full = list(
            model.snapshots.filter(commit_sha__startswith=commit)
            .values_list("commit_sha", flat=True)
            .order_by()
            .distinct()[:2]
        )
        if len(full) != 1:
            raise Http404("No single commit of this model starts with that id.")
        # The reader's setup (?engine=…) goes along: the redirect is permanent, kept by browsers.
        return HttpResponsePermanentRedirect(
            reverse("dashboard:model_at", args=[org, name, full[0]]) + setup_params(request)
        )
    if commit is not None:
        snapshot = get_object_or_404(
            model.snapshots.select_related("default_template"), commit_sha=commit
        )
    named = history.named_templates(snapshot) if snapshot and target not in LIVE_PARTIALS else None
    context = model_context(request, model, snapshot, named=named)
    context["pinned"] = commit is not None
    if target in LIVE_PARTIALS:
        response = render(request, f"dashboard/model.html#{target}", context)
    else:
        context["timeline"] = history.timeline(model)
        context["lineage"] = lineage_context(model)
        context["gguf_files"] = gguf_context(model, snapshot)
        context["named"] = named or []
        response = render(request, "dashboard/model.html", context)
    if context["polling"] or context["probe_polling"] or context["sync_since"]:
        # Live progress: neither our page cache nor the browser may keep this answer.
        response["Cache-Control"] = "no-store"
    return response


@require_safe
def probe_queue(request: HtmxHttpRequest) -> HttpResponse:
    """What waits for the Mac worker, what it ran lately, and whether it is online."""
    context = {"queue": ProbeQueue.load(), "worker": cached_status().probe_worker}
    template = "dashboard/probes.html#queue" if request.htmx else "dashboard/probes.html"
    response = render(request, template, context)
    # Ages and the worker's state move by the minute: not kept by our page cache or the browser.
    response["Cache-Control"] = "no-store"
    return response


@require_safe
def model_pair_latest(
    request: HttpRequest, org: str, name: str, variant: str, session: str, index: int
) -> HttpResponse:
    """`latest` link of a pair: the same pair in the model's current template."""
    try:
        model = _model_or_404(request, org, name)
    except UnknownModel as exc:
        return _unknown_model(request, exc.repo_id)
    if model.current_snapshot is None:
        raise Http404("this model has no template yet")
    sha = model.current_snapshot.default_template.sha256
    url = reverse("dashboard:pair", args=[sha, variant, session, index])
    return HttpResponseRedirect(f"{url}?model={model.repo_id}")


@require_safe
@cached_page
def template_detail(request: HttpRequest, sha256: str) -> HttpResponse:
    """One template version: its source, its verdicts and every model that uses it."""
    version = get_object_or_404(TemplateVersion, sha256=sha256)
    check = latest_check(version)
    users = models_using(version)
    view = ReportView.build(version, check)
    context = {
        "version": version,
        "check": check,
        "view": view,
        "users": users,
        "og_title": f"Chat template {version.sha256[:12]}: "
        f"{view.report.verdict if view.report else 'checking'}",
        "og_description": view.report.summary if view.report else "",
    }
    return render(request, "dashboard/template.html", context)


@require_safe
@cached_page
def pair_detail(
    request: HttpRequest, sha256: str, variant: str, session: str, index: int
) -> HttpResponse:
    """A failing request pair: both renders side by side, the divergence, the lines behind it."""
    version = get_object_or_404(TemplateVersion, sha256=sha256)
    check = latest_check(version)
    view = ReportView.build(version, check)
    location = find_pair(view.report, variant, session, index) if view.report else None
    if location is None or check is None:
        raise Http404("no such request pair in this template's check")
    # Special tokens come from a model that uses this version (the one in ?model= if it does).
    snapshot = version.snapshot_for(request.GET.get("model", ""))
    tokens = snapshot.token_strings() if snapshot else {}
    try:
        diff = pair_diff(version, tokens, location, check.engine_version)
        problem = ""
    except PairUnavailable as exc:
        diff, problem = None, str(exc)
    label = location.pair.index
    divergence = location.pair.divergence
    lines = set(divergence.lines_before + divergence.lines_after) if divergence else set()
    context = {
        "version": version,
        "check": check,
        "view": view,
        "location": location,
        "diff_sides": [
            ("before", diff.before_lines, f"Request {label}"),
            ("after", diff.after_lines, f"Request {label + 1}"),
        ]
        if diff
        else [],
        "og_title": f"{location.session.session} request {label} → {label + 1}: "
        f"{location.pair.cause}",
        "og_description": location.pair.detail,
        "diff": diff,
        "problem": problem,
        "model": snapshot.model if snapshot else None,
        # The same setting first: the pairs a reader compares this one with.
        "pair_lines": [line for line in view.source_lines if line.number in lines],
        "others": sorted(view.pairs, key=lambda loc: loc.variant_key != location.variant_key),
        "engine_rows": engine_rows(location.pair),
    }
    return render(request, "dashboard/pair.html", context)


def engine_rows(pair: RequestPair) -> list[dict[str, Any]]:
    """One row per engine cache class: what it reuses of the next request, and its bar."""
    reuse, needed = pair.reuse or {}, pair.needed or {}
    rows = []
    for cache_class in CACHE_CLASSES:
        got, need = reuse.get(cache_class), needed.get(cache_class)
        rows.append(
            {
                "label": CACHE_CLASS_LABELS[cache_class],
                "reused": got,
                "needed": need,
                "lost": got is not None and need is not None and got < need,
            }
        )
    return rows


@require_safe
@cached_page
def version_diff(request: HttpRequest, sha256: str, old_sha256: str) -> HttpResponse:
    """What changed upstream between two template versions, with the verdict before and after."""
    new = get_object_or_404(TemplateVersion, sha256=sha256)
    old = get_object_or_404(TemplateVersion, sha256=old_sha256)
    context = {
        "new": new,
        "old": old,
        "new_check": latest_check(new),
        "old_check": latest_check(old),
        "lines": history.line_diff(old, new),
        "model": HubModel.objects.filter(repo_id=request.GET.get("model", "")).first(),
    }
    return render(request, "dashboard/version_diff.html", context)


@require_safe
@cached_page
def badge(request: HttpRequest, org: str, name: str) -> HttpResponse:
    """An SVG badge for a model README; unknown models get a grey "not tracked" badge, and an
    unknown ?client=, ?engine= or ?thinking= a 400 whose badge says so (as the API refuses
    it): a README author sees the mistake instead of the headline verdict."""
    setup, setup_error = reader_setup(request)
    if setup_error:
        refused = HttpResponse(
            badges.render_badge(badges.BAD_SETUP),
            content_type="image/svg+xml; charset=utf-8",
            status=400,
        )
        refused["Cache-Control"] = "no-store"
        return refused
    if not is_chosen(request.GET):
        model = HubModel.objects.only("verdict", "repo_id").named(f"{org}/{name}")
        verdict = model.verdict if model else None
    else:
        # ?client=&engine=&thinking= (any, even with the typical value, as the catalog and
        # the API take it): the verdict for the reader's setup, from the report.
        model = HubModel.objects.select_related("catalog_verdict").named(f"{org}/{name}")
        chosen = model_setup_verdict(model, setup) if model else None
        if chosen is not None:
            verdict = chosen.verdict or badges.NOT_APPLICABLE
        elif model is None or model.current_snapshot_id is None:
            verdict = model.verdict if model else None
        else:
            # A check under way (a re-check, a new engine): the setup's verdict the catalog
            # lists meanwhile, not the headline, which counts every setting.
            verdict = stored_setup_verdict(model, setup) or Verdict.PENDING
    svg = badges.render_badge(verdict)
    response = HttpResponse(svg, content_type="image/svg+xml; charset=utf-8")
    # READMEs on the Hub go through an image proxy: a short max-age keeps it current.
    response["Cache-Control"] = "public, max-age=300"
    if model is None:
        response.status_code = 404
    return response


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "404.html", {"message": str(exception or "")}, status=404)


@require_http_methods(["GET", "HEAD", "POST"])
def diagnose_page(request: HttpRequest) -> HttpResponse:
    """Paste requests, pick a tracked model or paste a template, read why each request missed.
    Nothing pasted is stored; the answer is not cached."""
    context: dict[str, Any] = {
        "requests_text": "",
        "repo_id": request.GET.get("model", "")[:300],
        "template_text": "",
        "result": None,
        "error": "",
    }
    status_code = 200
    if request.method == "POST":
        context["requests_text"] = request.POST.get("requests", "")
        context["repo_id"] = request.POST.get("repo_id", "")[:300]
        context["template_text"] = request.POST.get("template", "")
        try:
            context["result"] = diagnosis.diagnose(
                context["requests_text"],
                repo_id=context["repo_id"],
                template=context["template_text"],
            )
        except diagnosis.DiagnosisError as exc:
            context["error"] = str(exc)
            status_code = exc.status
    response = render(request, "dashboard/diagnose.html", context, status=status_code)
    response["Cache-Control"] = "no-store"
    return response
