"""The Jinja2 environment of the templates under `dashboard/jinja2/`: the catalog's form and
results, what every search renders (docs/dashboard.md, "Search at 100,000 models", says why
they are not in the Django template language). Its filters are the dashboard's own, not
copies."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils import timezone
from jinja2 import Environment

from dashboard.templatetags.dashboard import (
    catalog_url,
    model_url,
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


def environment(**options: Any) -> Environment:
    env = Environment(**options)
    env.globals.update(
        url=lambda name, *args: reverse(name, args=args),
        model_url=model_url,
        labels=LABELS,
    )
    env.filters.update(
        label=lambda value, labels: labels.get(value, value),
        catalog_url=catalog_url,
        percent=percent,
        sentences=sentences,
        thousands=thousands,
        verdict_label=verdict_label,
        # What the Django template language's `date:'c'` and `date:'Y-m-d'` print.
        isoformat=lambda moment: timezone.localtime(moment).isoformat(),
        day=lambda moment: timezone.localtime(moment).strftime("%Y-%m-%d"),
    )
    return env
