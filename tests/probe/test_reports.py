"""Verdict rules, on hand-made pairs (no mlx)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from probe.measurements import (
    ConversationResult,
    Correctness,
    PairResult,
    ProbeReport,
    RepeatResult,
)

OK = Correctness(0.0, True, 0.1, True)
BAD = Correctness(2.5, False, 0.1, False)


def pair(reused: int, held: int = 100, reusable: int = 100, prompt: int = 150) -> PairResult:
    return PairResult(2, prompt, held, reusable, None, reused, 50.0, 5.0, OK)


def decided(*pairs: PairResult, repeat: RepeatResult | None = None) -> ConversationResult:
    result = ConversationResult("c", 0, "library", "forced", pairs=list(pairs))
    result.exact_repeat = repeat
    result.decide()
    return result


def test_hit_needs_everything_held() -> None:
    assert decided(pair(100), pair(100)).verdict == "hit"
    almost = decided(pair(100), pair(99))
    assert almost.verdict == "partial"
    assert almost.reused_share == 0.995


def test_miss_below_five_percent() -> None:
    assert decided(pair(0), pair(4)).verdict == "miss"
    assert decided(pair(0), pair(12)).verdict == "partial"


def test_engine_always_recomputes_one_token() -> None:
    # An exact extension by one token: 1 token must be prefilled, that is still a hit.
    assert decided(pair(100, held=101, reusable=101, prompt=101)).verdict == "hit"


def test_wrong_beats_hit_and_comes_from_the_repeat_too() -> None:
    bad_pair = PairResult(2, 150, 100, 100, None, 100, 50.0, 5.0, BAD)
    assert decided(bad_pair).verdict == "wrong"
    repeat = RepeatResult(150, 149, 50.0, 2.0, BAD)
    assert decided(pair(100), repeat=repeat).verdict == "wrong"


def test_disagreement_both_ways() -> None:
    assert decided(pair(100)).disagreement is False
    loses = decided(pair(90, reusable=100))
    assert (loses.disagreement, loses.disagreement_kind) == (True, "engine_loses")
    exceeds = decided(pair(100, reusable=90))
    assert exceeds.disagreement_kind == "engine_exceeds"
    both = decided(pair(100, reusable=90), pair(80, reusable=90))
    assert both.disagreement_kind == "both"


def test_prediction_from_job_wins_over_probe_lcp() -> None:
    p = PairResult(2, 150, 100, 100, 120, 100, 50.0, 5.0, OK)
    assert decided(p).disagreement_kind == "engine_loses"


def test_ttft_medians_and_ratio() -> None:
    a = PairResult(2, 150, 100, 100, None, 100, 40.0, 4.0, OK)
    b = PairResult(3, 150, 100, 100, None, 100, 60.0, 6.0, OK)
    c = PairResult(4, 150, 100, 100, None, 100, 80.0, 20.0, OK)
    result = decided(a, b, c)
    assert (result.cold_ttft_ms_median, result.warm_ttft_ms_median) == (60.0, 6.0)
    assert result.ttft_ratio == 10.0


def test_report_is_json_with_schema_version() -> None:
    report = ProbeReport("ok", {"repo_id": "x"}, {"chip": "y"}, results=[decided(pair(100))])
    data = json.loads(json.dumps(report.to_dict()))
    assert data["schema_version"] == 1
    assert data["results"][0]["pairs"][0]["correctness"]["ok"] is True


def test_main_side_imports_without_mlx() -> None:
    """The callback on the main side imports the runner and report types; mlx stays unloaded."""
    code = (
        "import sys, probe.runner, probe.measurements, probe.machine; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == "[]"
