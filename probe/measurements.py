"""The probe's report: typed results, verdict rules, and the JSON dict sent back to the main side.

No mlx import here: the callback that stores a report only needs these types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any, Literal

SCHEMA_VERSION = 1

Verdict = Literal["hit", "partial", "miss", "wrong"]
Disagreement = Literal["engine_loses", "engine_exceeds", "both"]

#: A conversation is a `hit` when the engine reused everything each previous turn left that the
#: next request could extend; a `miss` when it reused less than this share of it; `partial`
#: in between. Token counts decide, not timings.
MISS_BELOW = 0.05


@dataclass
class Correctness:
    """Warm vs cold log-probabilities of the first generated token."""

    max_abs_logprob_delta: float
    same_greedy_token: bool
    threshold: float
    ok: bool


@dataclass
class PairResult:
    """Request k+1 served after request k (index = k+1, 1-based over the conversation)."""

    index: int
    prompt_tokens: int
    held_tokens: int  # what the previous turn left in the cache and the next could extend
    reusable_tokens: int  # common prefix of that with the new prompt (the template's doing)
    predicted_tokens: int | None  # the check engine's prediction, shifted for the padding
    reused_tokens: int  # what the engine did not recompute
    cold_ttft_ms: float | None
    warm_ttft_ms: float | None
    correctness: Correctness | None
    note: str = ""
    #: What checks.reuse estimates this path's cache class reuses, from the same tokens.
    estimated_tokens: int | None = None


@dataclass
class RepeatResult:
    """The last request sent again unchanged: 1 token left to prefill on a perfect cache."""

    prompt_tokens: int
    reused_tokens: int
    cold_ttft_ms: float | None
    warm_ttft_ms: float | None
    correctness: Correctness | None
    estimated_tokens: int | None = None


@dataclass
class ConversationResult:
    """One conversation at one prompt size through one path."""

    conversation: str
    prompt_size: int  # target system-prompt tokens (0: as given)
    path: str  # library | library_checkpoints | suffix_only_client | server
    reply_mode: str  # forced | generated
    verdict: Verdict | None = None
    reused_share: float | None = None
    disagreement: bool = False
    disagreement_kind: Disagreement | None = None
    predicted_source: Literal["job", "probe"] = "probe"
    cold_ttft_ms_median: float | None = None
    warm_ttft_ms_median: float | None = None
    ttft_ratio: float | None = None
    pairs: list[PairResult] = field(default_factory=list)
    exact_repeat: RepeatResult | None = None
    cache_layers: list[dict[str, Any]] = field(default_factory=list)
    kv_snapshot_bytes: int | None = None
    prompt_cache_bytes: int | None = None
    peak_memory_bytes: int | None = None
    seconds: float | None = None
    agrees_with: dict[str, Any] | None = None
    error: str | None = None
    #: The engine cache class (checks.reuse) this path behaved as, and whether every measured
    #: reuse equals that class's estimate.
    cache_class: str | None = None
    estimate_agrees: bool | None = None

    def decide(self, miss_below: float = MISS_BELOW) -> None:
        """Set verdict, reused share, medians and the disagreement flag from the pairs."""
        checks = [p.correctness for p in self.pairs]
        if self.exact_repeat is not None:
            checks.append(self.exact_repeat.correctness)
        # An engine always recomputes at least the last prompt token.
        held = [min(p.held_tokens, p.prompt_tokens - 1) for p in self.pairs]
        reused = [min(p.reused_tokens, h) for p, h in zip(self.pairs, held, strict=True)]
        self.reused_share = round(sum(reused) / sum(held), 4) if sum(held) else None
        if any(c is not None and not c.ok for c in checks):
            self.verdict = "wrong"
        elif self.reused_share is None:
            self.verdict = None
        elif reused == held:
            self.verdict = "hit"
        elif self.reused_share < miss_below:
            self.verdict = "miss"
        else:
            self.verdict = "partial"
        loses = exceeds = False
        for p in self.pairs:
            expected = p.predicted_tokens if p.predicted_tokens is not None else p.reusable_tokens
            expected = min(expected, p.prompt_tokens - 1)
            loses |= p.reused_tokens < expected
            exceeds |= p.reused_tokens > expected
        self.disagreement = loses or exceeds
        self.disagreement_kind = (
            "both"
            if loses and exceeds
            else "engine_loses"
            if loses
            else "engine_exceeds"
            if exceeds
            else None
        )
        cold = [p.cold_ttft_ms for p in self.pairs if p.cold_ttft_ms is not None]
        warm = [p.warm_ttft_ms for p in self.pairs if p.warm_ttft_ms is not None]
        self.cold_ttft_ms_median = round(median(cold), 3) if cold else None
        self.warm_ttft_ms_median = round(median(warm), 3) if warm else None
        if self.cold_ttft_ms_median and self.warm_ttft_ms_median:
            self.ttft_ratio = round(self.cold_ttft_ms_median / self.warm_ttft_ms_median, 2)


@dataclass
class ProbeReport:
    """Everything one job measured, or why it could not."""

    status: Literal["ok", "error"]
    job: dict[str, Any]
    machine: dict[str, Any]
    error: str | None = None
    model: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    results: list[ConversationResult] = field(default_factory=list)
    started_at: str = ""
    seconds: float = 0.0
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable dict."""
        return asdict(self)


def error_report(job: dict[str, Any], machine: dict[str, Any], reason: str) -> dict[str, Any]:
    """The report of a job that could not run at all."""
    return ProbeReport("error", job_summary(job), machine, error=reason).to_dict()


def job_summary(job: dict[str, Any]) -> dict[str, Any]:
    """What identifies a job in its report (not the conversations themselves)."""
    keys = ("repo_id", "revision", "quantization", "model_dir", "prompt_sizes", "paths")
    return {k: job.get(k) for k in keys if k in job}
