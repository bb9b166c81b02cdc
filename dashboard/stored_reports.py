"""Reading the engine's stored reports: stable keys for variants, matrices, pairs to diff.

The engine's dataclasses (`checks.reports`) are rebuilt with `from_dict`; everything here uses
their attributes, so a new report field never breaks a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checks.conversations import SESSIONS, session_named
from checks.digest import variant_key
from checks.figures import ShareFigure, broken_pairs, setting_figure, share_figure
from checks.reports import (
    RequestPair,
    SessionResult,
    TemplateReport,
    VariantResult,
)

SESSION_TITLES = {s.name: s.title for s in SESSIONS}


def rebuild(data: dict[str, Any] | None) -> TemplateReport | None:
    """The stored `TemplateReport.to_dict()`, as the engine's dataclass (None if absent/foreign)."""
    if not data:
        return None
    try:
        return TemplateReport.from_dict(data)
    except (KeyError, TypeError, ValueError):
        return None


def find_variant(report: TemplateReport, key: str) -> VariantResult | None:
    return next((v for v in report.variants if variant_key(v) == key), None)


@dataclass(frozen=True)
class PairLocation:
    """Where one request pair sits in a report; the parts of its URL."""

    variant: VariantResult
    session: SessionResult
    pair: RequestPair

    @property
    def variant_key(self) -> str:
        return variant_key(self.variant)

    @property
    def url_args(self) -> tuple[str, str, int]:
        return (self.variant_key, self.session.session, self.pair.index)

    @property
    def session_title(self) -> str:
        return SESSION_TITLES.get(self.session.session, self.session.session)

    @property
    def breaks_figure(self) -> ShareFigure | None:
        """What the setting's breaking pairs keep: the summary's figure for this setting."""
        return share_figure(broken_pairs(self.variant.sessions))


def find_pair(report: TemplateReport, key: str, session: str, index: int) -> PairLocation | None:
    variant = find_variant(report, key)
    if variant is None:
        return None
    for result in variant.sessions:
        if result.session == session:
            for pair in result.pairs:
                if pair.index == index:
                    return PairLocation(variant, result, pair)
    return None


def failing_pairs(report: TemplateReport) -> list[PairLocation]:
    """Every pair that does not pass (fail first, then warnings), in the engine's order."""
    found = [
        PairLocation(v, s, p)
        for v in report.variants
        for s in v.sessions
        for p in s.pairs
        if p.status != "pass"
    ]
    order = {"fail": 0, "reply": 1}
    return sorted(found, key=lambda loc: order.get(loc.pair.status, 2))


@dataclass(frozen=True)
class MatrixCell:
    """One variant × session: the worst pair, and the pair to open when it is not a pass."""

    status: str  # "pass", "warn", "reply", "fail", "not_rendered"
    detail: str
    first: PairLocation | None
    share: float | None


@dataclass(frozen=True)
class MatrixRow:
    key: str
    variant: VariantResult
    cells: list[MatrixCell]
    #: The "Reused" column: the setting's mean share of the next prompt kept.
    figure: ShareFigure | None = None


def matrix(report: TemplateReport) -> tuple[list[str], list[MatrixRow]]:
    """Sessions (columns) and one row per variant."""
    sessions = [s.name for s in SESSIONS]
    for variant in report.variants:
        for result in variant.sessions:
            if result.session not in sessions:
                sessions.append(result.session)
    rows = []
    for variant in report.variants:
        by_name = {s.session: s for s in variant.sessions}
        cells = []
        for name in sessions:
            found = by_name.get(name)
            if found is None or not found.rendered:
                detail = (found.error or "") if found else "not replayed"
                cells.append(MatrixCell("not_rendered", detail, None, None))
                continue
            result = found
            worst = next(
                (
                    p
                    for status in ("fail", "reply", "warn")
                    for p in result.pairs
                    if p.status == status
                ),
                None,
            )
            shares = [p.reusable_share for p in result.pairs]
            share = min(shares) if shares else None
            if worst is None:
                cells.append(MatrixCell("pass", "", None, share))
            else:
                location = PairLocation(variant, result, worst)
                cells.append(MatrixCell(worst.status, worst.detail, location, share))
        figure = setting_figure(s for s in variant.sessions if s.rendered)
        rows.append(MatrixRow(variant_key(variant), variant, cells, figure))
    return sessions, rows


def culprit_lines(report: TemplateReport) -> set[int]:
    """Template lines that wrote diverging bytes, or that a confirmed finding points at."""
    lines = {line for failure in report.failures for line in failure.template_lines}
    for finding in report.findings:
        if finding.status == "confirmed":
            lines.update(finding.lines)
    return lines


def session_title(name: str) -> str:
    try:
        return session_named(name).title
    except KeyError:
        return name
