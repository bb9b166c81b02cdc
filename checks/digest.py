"""What a catalog row needs of a report: per-setting verdicts, tool support, one line per variant.

Pure functions of a `TemplateReport`; the registry stores their result beside a model's verdict
so that listing pages filter and sort without reading reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from checks.clients import PROFILE_NAMES
from checks.conversations import SESSIONS
from checks.reports import ERROR, TemplateReport, VariantResult
from checks.reuse import CACHE_CLASSES
from checks.setups import THINKING_CHOICES, THINKING_DEFAULT, variant_for, verdict_in

THINKING_SWITCH = "enable_thinking"
TOOL_SESSIONS = frozenset(s.name for s in SESSIONS if s.uses_tools)


def variant_key(variant: VariantResult) -> str:
    """A URL-safe, stable name for a variant: `default`, `enable_thinking=false`, `tool_use`."""
    parts = [] if variant.template_name == "default" else [variant.template_name]
    for name, value in variant.kwargs.items():
        shown = value if isinstance(value, str) else json.dumps(value)
        parts.append(f"{name}={shown}")
    return "+".join(parts) or "default"


#: The catalog row's columns (`registry.models.CatalogVerdict`): all of `ReportDigest` but reuse.
CATALOG_ROW_FIELDS = ("thinking", "thinking_off", "thinking_on", "tools", "variants", "setups")


@dataclass(frozen=True)
class ReportDigest:
    """The catalog's columns for one report: the catalog row's (`fields`, for
    `registry.models.CatalogVerdict`) and `reuse` (the model's own column, which the catalog's
    "Prompt reuse" order walks)."""

    thinking: str
    thinking_off: str
    thinking_on: str
    tools: str
    variants: list[dict[str, Any]]
    #: {thinking choice: {client profile: {engine cache class: verdict}}} (checks.setups).
    setups: dict[str, dict[str, dict[str, str]]]
    #: The headline setting's mean share of the next prompt a prefix cache keeps, over every
    #: request pair of every conversation it renders (`VariantResult.mean_reusable_share`).
    reuse: float | None = None

    def fields(self) -> dict[str, Any]:
        """The catalog row's columns (all but `reuse`)."""
        return {name: getattr(self, name) for name in CATALOG_ROW_FIELDS}


def _thinking_verdict(report: TemplateReport, value: bool) -> str:
    for variant in report.variants:
        if variant.template_name == "default" and variant.kwargs.get(THINKING_SWITCH) is value:
            return variant.verdict
    return ""


def _tools_status(report: TemplateReport) -> str:
    if not report.variants:
        return "unsupported" if report.verdict == ERROR else "unknown"
    # The setting a caller gets without chat_template_kwargs: the first variant the engine plans.
    default = report.variants[0]
    tool_runs = [s for s in default.sessions if s.session in TOOL_SESSIONS and s.rendered]
    if not tool_runs:
        return "unsupported"
    if any(p.status == "fail" for s in tool_runs for p in s.pairs):
        return "unsafe"
    return "safe"


def digest(report: TemplateReport) -> ReportDigest:
    off, on = _thinking_verdict(report, False), _thinking_verdict(report, True)
    thinking = "none" if not off and not on else "same" if off == on else "differs"
    variants = [
        {
            "key": variant_key(v),
            "label": v.label,
            "verdict": v.verdict,
            "share": v.mean_reusable_share,
        }
        for v in report.variants
    ]
    headline = variant_for(report, THINKING_DEFAULT)
    return ReportDigest(
        thinking,
        off,
        on,
        _tools_status(report),
        variants,
        _setups(report),
        headline.mean_reusable_share if headline is not None else None,
    )


def _setups(report: TemplateReport) -> dict[str, dict[str, dict[str, str]]]:
    """Every setup's verdict, so the catalog filters on the reader's setup without reports."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for thinking in THINKING_CHOICES:
        variant = variant_for(report, thinking)
        if variant is None:
            continue
        out[thinking] = {
            client: {
                engine: verdict
                for engine in CACHE_CLASSES
                if (verdict := verdict_in(variant, client, engine)) is not None
            }
            for client in PROFILE_NAMES
        }
    return out
