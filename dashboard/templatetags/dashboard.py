"""Small filters for the dashboard's templates: percentages, short hashes, repo URL parts."""

from __future__ import annotations

import re
from datetime import timedelta
from functools import cache, lru_cache
from typing import Any
from urllib.parse import quote

from django import template
from django.conf import settings
from django.template import Context, engines
from django.templatetags.static import static
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe
from django_htmx.jinja import htmx_script

from checks import figures
from checks.setups import Setup
from dashboard.catalog import CatalogQuery
from dashboard.pairs import shown_controls
from dashboard.stored_reports import PairLocation
from registry.models import Verdict

register = template.Library()


@register.filter
def percent(value: float | None) -> str:
    return figures.percent(value)


@register.filter
def short(value: str | None, length: int = 12) -> str:
    return (value or "")[:length]


@register.simple_tag
def model_url(repo_id: str, *rest: object) -> str:
    """`{% model_url repo_id %}` → /m/<org>/<name>/ (a repo id holds exactly one slash)."""
    return f"{model_url_stem()}{model_path(repo_id)}"


def model_url_stem() -> str:
    """What comes before the repo id in a model page's URL (`model_url`), under the
    thread's script prefix: a page of 50 rows looks it up once (`model_path` then gives each
    row's), where a lookup of the script prefix a row cost 1.4 µs."""
    return _model_url_stem(get_script_prefix())


@cache
def _model_url_stem(script_prefix: str) -> str:
    """What comes before the repo id in a model page's URL, asked of the URLconf once per
    script prefix: `reverse()` cost 40 µs, and a catalog page links 50 models."""
    return reverse("dashboard:model", args=["o", "n"]).removesuffix("o/n/")


#: A repo id whose two parts `quote` leaves as they are (letters, digits, `_.-~`): most.
_PLAIN_REPO_ID = re.compile(r"[A-Za-z0-9_.~-]+/[A-Za-z0-9_.~-]+")


def model_path(repo_id: str) -> str:
    """The part of a model page's URL after `model_url_stem`: `<org>/<name>/`, each part
    quoted. A repo id that quoting leaves as it is is its own path, without the two `quote`
    calls (0.8 µs a row). Every id the service writes holds one slash (`validate_repo_id`),
    but the table takes any: one without a slash links a name-less path (a 404, where
    unpacking it failed every page that listed it)."""
    if _PLAIN_REPO_ID.fullmatch(repo_id):
        return f"{repo_id}/"
    org, _, name = repo_id.partition("/")
    return f"{quote(org, safe='')}/{quote(name, safe='')}/"


def fixed_url(name: str) -> str:
    """What `{% url "dashboard:feed" %}` gives for a view that takes no argument, asked of
    the URLconf once per name, script prefix and URLconf: `reverse()` cost about 25 µs (the
    Jinja2 templates' `url()`, and `frame`)."""
    return _fixed_url(name, get_script_prefix(), get_urlconf() or settings.ROOT_URLCONF)


@lru_cache(maxsize=256)
def _fixed_url(name: str, script_prefix: str, urlconf: str) -> str:
    return reverse(name, urlconf=urlconf)  # under that script prefix: the thread's now


#: What every page's frame links (templates/base.html, through `frame`): views that take no
#: argument, by their names, and static files, by their paths.
FRAME_LINKS = {
    "catalog": "dashboard:catalog",
    "diagnose": "dashboard:diagnose",
    "probes": "dashboard:probes",
    "alerts": "alerts:settings",
    "api_docs": "dashboard:api_docs",
    "feed": "dashboard:feed",
}
FRAME_FILES = {"css": "css/cachesafe.css", "icon": "favicon.svg", "js": "js/cachesafe.js"}


@register.simple_tag
def frame() -> dict[str, str]:
    """`{% frame as frame %}`: what every page's frame links, by `FRAME_LINKS`' and
    `FRAME_FILES`' keys, and htmx's script element (`htmx`), made once per process, script
    prefix, URLconf, static URL and `DEBUG` (which adds django-htmx's debug script). A frame
    asked for them with ten `{% url %}` (or `{% fixed_url %}`), three `{% static %}` and an
    `{% htmx_script %}`: 310 of the 460 µs it took to render (in one process)."""
    return _frame(
        get_script_prefix(),
        get_urlconf() or settings.ROOT_URLCONF,
        settings.STATIC_URL,
        settings.DEBUG,
    )


@lru_cache(maxsize=64)
def _frame(script_prefix: str, urlconf: str, static_url: str, debug: bool) -> dict[str, str]:
    links = {key: _fixed_url(name, script_prefix, urlconf) for key, name in FRAME_LINKS.items()}
    files = {key: static(path) for key, path in FRAME_FILES.items()}
    return {**links, **files, "htmx": htmx_script()}


@register.simple_tag(takes_context=True)
def jinja(context: Context, name: str) -> SafeString:
    """`{% jinja "dashboard/catalog_listing.html" %}`: a template under `dashboard/jinja2/`,
    rendered by Jinja2 with this page's context. Jinja2 escapes every value it prints
    (autoescape), so its output is markup."""
    template = engines["jinja2"].get_template(name)
    values: dict[str, Any] = {str(key): value for key, value in context.flatten().items()}
    return mark_safe(template.render(values))


@register.simple_tag
def pair_url(sha256: str, location: PairLocation) -> str:
    return reverse("dashboard:pair", args=[sha256, *location.url_args])


_VERDICT_LABELS = {value: str(label) for value, label in Verdict.choices}


@register.filter
def verdict_label(value: str) -> str:
    return _VERDICT_LABELS.get(value, value)


@register.filter
def catalog_url(query: CatalogQuery, page: int) -> str:
    """The catalog link of `query` at another page (filters and sort kept)."""
    return query.url(page=str(page))


@register.filter
def thousands(value: int | None) -> str:
    return f"{value:,}" if isinstance(value, int) else ""


@register.filter
def repo_org(repo_id: str) -> str:
    return repo_id.split("/", 1)[0]


@register.filter
def repo_name(repo_id: str) -> str:
    return repo_id.split("/", 1)[-1]


@register.filter
def elapsed(value: timedelta | None) -> str:
    """A duration the way a person reads it: "42 s", "3 min", "2 h 5 min"."""
    if value is None:
        return "–"
    seconds = max(0, int(value.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


@register.filter
def attr_of(value: object, name: str) -> object:
    """`setup|attr_of:"client"`: an attribute by name, for loops over field names."""
    return getattr(value, name, "")


@register.filter
def setup_query(setup: Setup, thinking: str) -> str:
    """The query string of `setup` with another thinking setting."""
    return setup.query(thinking=thinking)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


@register.filter
def sentences(text: str, limit: int = 200) -> str:
    """Whole sentences, as many as fit in `limit` characters, and always through the first one
    that gives a share ("only about 30% of the next prompt…"): a summary never loses its number
    to a cut."""
    parts = _SENTENCE_END.split(text or "")
    figure = next((i for i, part in enumerate(parts) if "%" in part), 0)
    kept = parts[: figure + 1]
    for part in parts[figure + 1 :]:
        if len(" ".join([*kept, part])) > limit:
            break
        kept.append(part)
    shown = " ".join(kept)
    return shown if len(kept) == len(parts) else f"{shown} …"


@register.filter
def code_text(value: object) -> SafeString:
    """Text from the Hub (a template's lines, a commit title, a family), escaped, with the
    characters that would reorder or hide what is shown (bidi overrides, zero-width ones)
    shown by their code points instead (`dashboard.pairs.shown_controls`)."""
    return mark_safe(shown_controls(str(conditional_escape(str(value)))))  # noqa: S308 - escaped
