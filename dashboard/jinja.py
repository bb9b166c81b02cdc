"""The Jinja2 environment of the templates under `dashboard/jinja2/`: the catalog's form and
results, what every search renders (docs/dashboard.md, "Search at 100,000 models", says why
they are not in the Django template language). Its filters are the dashboard's own, not
copies."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from datetime import datetime, tzinfo
from typing import Any

from django.urls import reverse
from django.utils import timezone
from jinja2 import Environment
from markupsafe import Markup

from dashboard.templatetags.dashboard import (
    catalog_url,
    fixed_url,
    model_path,
    model_url_stem,
    percent,
    sentences,
    thousands,
    verdict_label,
)
from registry.models import ModelFormat, ModelStatus, ProbeStatus


def _labels(choices: list[tuple[str, str]]) -> dict[str, str]:
    return {value: str(label) for value, label in choices}


#: What `get_<field>_display()` prints, as plain lookups: that method walks and hashes the
#: field's choices on every call, up to three times a row.
LABELS = {
    "format": _labels(ModelFormat.choices),
    "status": _labels(ModelStatus.choices),
    "probe": _labels(ProbeStatus.choices),
}


#: The menu states kept: each menu's choices plus "any", for the ten menus (about 60).
MENU_STATES = 256


def form_menus(env: Environment) -> Callable[..., Markup]:
    """`menu(name, label, choices, empty="Any", skip=None, selected="")`: a menu of the
    catalog's form (dashboard/catalog_menu.html), rendered once per process and state. The
    ten menus cost 0.3 of the 1.7 ms a search page with no result took (in one process, at
    100,000 models); their markup depends on nothing but these arguments. When templates
    reload (DEBUG), nothing is kept."""

    def render(*args: Any) -> Markup:
        macro = env.get_template("dashboard/catalog_menu.html").module.menu  # type: ignore[attr-defined]
        return Markup(macro(*args))

    kept = functools.lru_cache(maxsize=MENU_STATES)(render)

    def menu(
        name: str,
        label: str,
        choices: Iterable[tuple[str, str]],
        empty: str | None = "Any",
        skip: str | None = None,
        selected: str = "",
    ) -> Markup:
        args = (
            name,
            label,
            tuple((value, str(text)) for value, text in choices),
            empty,
            skip,
            selected,
        )
        return render(*args) if env.auto_reload else kept(*args)

    return menu


def day_element(moment: datetime, zone: tzinfo) -> Markup:
    """`moment` as a `<time>` element: its day, and the moment itself in its `datetime`
    attribute (what the Django template language's `date:'Y-m-d'` and `date:'c'` print), in
    `zone`: the current time zone, which a page looks up once for all its rows
    (`current_zone`). Looked up for each row, with `strftime` for the day, it took 11.9 µs a
    row, 3.2 with the zone looked up once, and less with the day cut from the moment's own
    ISO form."""
    local = moment.astimezone(zone).isoformat()  # digits and separators: nothing to escape
    return Markup(f'<time datetime="{local}">{local[:10]}</time>')


def environment(**options: Any) -> Environment:
    env = Environment(**options)
    env.globals.update(
        menu=form_menus(env),
        url=lambda name, *args: reverse(name, args=args) if args else fixed_url(name),
        model_url_stem=model_url_stem,
        labels=LABELS,
        current_zone=timezone.get_current_timezone,
    )
    env.filters.update(
        label=lambda value, labels: labels.get(value, value),
        catalog_url=catalog_url,
        percent=percent,
        sentences=sentences,
        thousands=thousands,
        verdict_label=verdict_label,
        day_element=day_element,
        model_path=model_path,
    )
    return env
