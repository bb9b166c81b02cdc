"""What a page shows of a template's check: the report rebuilt, its matrix, pairs and source."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

from checks import policy
from checks.attribution import template_lines
from checks.clients import PROFILES
from checks.figures import ShareFigure, share_figure
from checks.policy import is_primary
from checks.reports import TemplateReport
from checks.reuse import CACHE_CLASS_LABELS, CACHE_CLASSES
from checks.setups import Setup, SetupVerdict, reply_fate, setup_verdict
from registry.models import CheckRun, CheckStatus, HubModel, TemplateVersion
from registry.verdicts import model_check

from .stored_reports import (
    MatrixRow,
    PairLocation,
    culprit_lines,
    failing_pairs,
    matrix,
    rebuild,
)

HYBRID_NOTE = (
    "This is a hybrid (recurrent + attention) model: its cache cannot be trimmed back, so any "
    "divergence costs everything back to the engine's last checkpoint."
)


@dataclass
class BreakGroup:
    """Pairs that break the same way (same cause, same wording up to message numbers)."""

    cause: str
    status: str
    detail: str
    pairs: list[PairLocation]

    @property
    def first(self) -> PairLocation:
        return self.pairs[0]

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(p.variant.label for p in self.pairs))

    @property
    def sessions(self) -> list[str]:
        return list(dict.fromkeys(p.session.session for p in self.pairs))

    @property
    def lines(self) -> list[int]:
        found: set[int] = set()
        for location in self.pairs:
            divergence = location.pair.divergence
            if divergence:
                found.update(divergence.lines_before + divergence.lines_after)
        return sorted(found)

    @property
    def figure(self) -> ShareFigure:
        """The share of the next prompt these pairs keep: mean, lowest, highest."""
        figure = share_figure(p.pair for p in self.pairs)
        assert figure is not None  # a group has at least one pair
        return figure


def group_breaks(pairs: list[PairLocation]) -> list[BreakGroup]:
    groups: dict[tuple[str, str, str], BreakGroup] = {}
    for location in pairs:
        pair = location.pair
        key = (pair.status, pair.cause or "", re.sub(r"\d+", "#", pair.detail))
        if key not in groups:
            groups[key] = BreakGroup(pair.cause or "", pair.status, pair.detail, [])
        groups[key].pairs.append(location)
    return list(groups.values())


@dataclass(frozen=True)
class SourceLine:
    number: int
    text: str
    culprit: bool


@dataclass(frozen=True)
class SetupRow:
    profile: str
    label: str
    verdict: str | None
    note: str
    cells: list[str]  # one verdict per engine cache class, in ENGINE_COLUMNS order
    reply: str


@dataclass(frozen=True)
class SetupGrid:
    """The first primary setting's verdict for each client profile × engine cache class."""

    setting: str
    engines: list[str]
    rows: list[SetupRow]


def setup_grid(report: TemplateReport) -> SetupGrid | None:
    variant = next((v for v in report.variants if v.clients and is_primary(v)), None)
    if variant is None:
        return None
    labels = {p.name: p.label for p in PROFILES}
    rows = []
    for client in variant.clients:
        rows.append(
            SetupRow(
                client.profile,
                labels.get(client.profile, client.profile),
                client.verdict,
                client.note,
                [client.engines.get(c, "") for c in CACHE_CLASSES],
                reply_fate(client),
            )
        )
    return SetupGrid(variant.label, [CACHE_CLASS_LABELS[c] for c in CACHE_CLASSES], rows)


@dataclass
class ReportView:
    version: TemplateVersion
    check: CheckRun | None
    report: TemplateReport | None
    sessions: list[str] = field(default_factory=list)
    rows: list[MatrixRow] = field(default_factory=list)
    pairs: list[PairLocation] = field(default_factory=list)
    culprits: set[int] = field(default_factory=set)

    @classmethod
    def build(cls, version: TemplateVersion, check: CheckRun | None) -> ReportView:
        done = check is not None and check.status == CheckStatus.DONE
        report = rebuild(check.report) if done and check is not None else None
        view = cls(version, check, report)
        if report is not None:
            view.sessions, view.rows = matrix(report)
            view.pairs = failing_pairs(report)
            view.culprits = culprit_lines(report)
        return view

    @property
    def checking(self) -> bool:
        """Not checked yet, or the check is queued or running."""
        return self.check is None or self.check.status in (CheckStatus.PENDING, CheckStatus.RUNNING)

    @property
    def failed(self) -> bool:
        return self.check is not None and self.check.status == CheckStatus.FAILED

    @property
    def source_lines(self) -> list[SourceLine]:
        return [
            SourceLine(number, text, number in self.culprits)
            for number, text in enumerate(template_lines(self.version.text), start=1)
        ]

    @property
    def groups(self) -> list[BreakGroup]:
        return group_breaks(self.pairs)

    @property
    def setups(self) -> SetupGrid | None:
        return setup_grid(self.report) if self.report is not None else None

    @property
    def fails(self) -> list[PairLocation]:
        return [p for p in self.pairs if p.pair.status == "fail"]

    @property
    def warnings(self) -> list[PairLocation]:
        return [p for p in self.pairs if p.pair.status == "warn"]


def model_sentence(model: HubModel, view: ReportView | None) -> str:
    """The verdict in words a user can act on (the engine's summary, plus the hybrid cost)."""
    if view is None:
        return model.status_reason or "We have not found a chat template for this model yet."
    if view.report is None:
        if view.failed and view.check is not None:
            reason = view.check.error or "no reason recorded"
            return f"The check of this template could not finish ({reason})."
        return "Checking this template: the verdict appears here as soon as it is ready."
    sentence = view.report.summary
    if model.is_hybrid and view.report.verdict == "unsafe":
        sentence = f"{sentence} {HYBRID_NOTE}"
    return sentence


def no_default_sentence(model: HubModel, names: Collection[str]) -> str:
    """The verdict in words of a model whose named templates have none named `default`: its own
    summary over them once it says so (one from before did not), else that a name is needed."""
    lead = policy.no_default_sentence(names)
    return model.verdict_summary if model.verdict_summary.startswith(lead) else lead


def model_setup_verdict(model: HubModel, setup: Setup) -> SetupVerdict | None:
    """The verdict of a model's current template for a reader's setup (None: no report yet)."""
    snapshot = model.current_snapshot
    if snapshot is None:
        return None
    check = model_check(snapshot)
    if check is None or check.status != CheckStatus.DONE:
        return None
    report = rebuild(check.report)
    return setup_verdict(report, setup) if report is not None else None
