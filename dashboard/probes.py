"""The Mac probe's results as the dashboard shows them: the catalog's probe column, a model's
latest probe read out of its report, and the probe queue."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from registry.models import (
    HubModel,
    ProbeRun,
    ProbeState,
    ProbeVerdict,
)

#: How many finished probes the queue page lists.
RECENT_LIMIT = 20


def latest_probe(model: HubModel) -> ProbeRun | None:
    return ProbeRun.objects.filter(model=model).order_by("-queued_at", "-id").first()


@dataclass(frozen=True)
class ProbeResultRow:
    """One conversation × prompt size × path of a probe report."""

    conversation: str
    prompt_size: int
    path: str
    verdict: str
    reused_share: float | None
    disagreement: str
    #: The check's prediction; without one (`predicted_source: probe`), the token LCP.
    predicted_tokens: int | None
    predicted_source: str
    reused_tokens: int | None
    held_tokens: int | None
    cold_ttft_ms: float | None
    warm_ttft_ms: float | None
    ttft_ratio: float | None
    repeat_ok: bool | None
    repeat_delta: float | None
    agrees_with: Any
    error: str


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _total(pairs: list[dict[str, Any]], key: str) -> int | None:
    values = [p.get(key) for p in pairs if isinstance(p.get(key), int)]
    return sum(values) if values else None  # type: ignore[arg-type]


def _predicted(pair: dict[str, Any]) -> Any:
    """The job's prediction, else what the probe found reusable (its own token LCP)."""
    predicted = pair.get("predicted_tokens")
    return predicted if predicted is not None else pair.get("reusable_tokens")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _row(result: dict[str, Any]) -> ProbeResultRow:
    """One result of a report, read for what it should hold: a field of another type (the
    report is stored as the probe sent it) reads as missing, never as an error."""
    pairs = [p for p in _list(result.get("pairs")) if isinstance(p, dict)]
    correctness = _dict(_dict(result.get("exact_repeat")).get("correctness"))
    size = result.get("prompt_size")
    disagreement = result.get("disagreement_kind") or ("yes" if result.get("disagreement") else "")
    return ProbeResultRow(
        conversation=str(result.get("conversation", "")),
        prompt_size=size if isinstance(size, int) and not isinstance(size, bool) else 0,
        path=str(result.get("path", "")),
        verdict=str(result.get("verdict") or ""),
        reused_share=_number(result.get("reused_share")),
        disagreement=str(disagreement),
        predicted_tokens=_total(
            [{**p, "predicted_tokens": _predicted(p)} for p in pairs], "predicted_tokens"
        ),
        predicted_source=str(result.get("predicted_source") or ""),
        reused_tokens=_total(pairs, "reused_tokens"),
        held_tokens=_total(pairs, "held_tokens"),
        cold_ttft_ms=_number(result.get("cold_ttft_ms_median")),
        warm_ttft_ms=_number(result.get("warm_ttft_ms_median")),
        ttft_ratio=_number(result.get("ttft_ratio")),
        repeat_ok=correctness.get("ok") if isinstance(correctness.get("ok"), bool) else None,
        repeat_delta=_number(correctness.get("max_abs_logprob_delta")),
        agrees_with=result.get("agrees_with"),
        error=str(result.get("error") or ""),
    )


@dataclass(frozen=True)
class ProbeView:
    """A model's latest probe: its state and verdict, the machine, one row per result."""

    run: ProbeRun
    rows: list[ProbeResultRow] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    cache_layers: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, run: ProbeRun) -> ProbeView:
        report = _dict(run.report)
        results = [r for r in _list(report.get("results")) if isinstance(r, dict)]
        cache_layers = _list(_dict(report.get("model")).get("cache_layers"))
        layers = [str(c.get("class", "")) for c in cache_layers if isinstance(c, dict)]
        # Layer classes, counted: "ArraysCache × 3, KVCache × 1".
        counted = {name: layers.count(name) for name in dict.fromkeys(layers)}
        return cls(
            run=run,
            rows=[_row(r) for r in results],
            machine=_dict(run.machine) or _dict(report.get("machine")),
            cache_layers=[f"{name} × {n}" for name, n in counted.items()],
        )

    @property
    def waiting(self) -> bool:
        return self.run.state in (ProbeState.QUEUED, ProbeState.RUNNING)

    @property
    def verdict_label(self) -> str:
        return ProbeVerdict(self.run.verdict).label if self.run.verdict else ""


@dataclass(frozen=True)
class QueuedProbe:
    run: ProbeRun
    position: int
    age: timedelta


@dataclass(frozen=True)
class FinishedProbe:
    run: ProbeRun
    duration: timedelta | None


@dataclass(frozen=True)
class ProbeQueue:
    """What waits for the Mac worker, in the order it will run, and what ran recently."""

    waiting: list[QueuedProbe]
    recent: list[FinishedProbe]
    now: datetime

    @classmethod
    def load(cls, recent_limit: int = RECENT_LIMIT) -> ProbeQueue:
        now = timezone.now()
        # The broker hands probes out in the order they were sent: oldest first.
        waiting = list(
            ProbeRun.objects.waiting()
            .select_related("model")
            .only("model__repo_id", "state", "queued_at", "started_at", "worker", "commit_sha")
            .order_by("queued_at", "id")
        )
        recent = list(
            ProbeRun.objects.filter(state__in=[ProbeState.DONE, ProbeState.ERROR])
            .select_related("model")
            .defer("report")
            .order_by("-finished_at", "-id")[:recent_limit]
        )
        return cls(
            waiting=[
                QueuedProbe(run, position, now - run.queued_at)
                for position, run in enumerate(waiting, start=1)
            ],
            recent=[FinishedProbe(run, duration(run)) for run in recent],
            now=now,
        )


def duration(run: ProbeRun) -> timedelta | None:
    """Time on the Mac (from its start to the stored report), when both are known."""
    if run.started_at is None or run.finished_at is None:
        return None
    return run.finished_at - run.started_at
