"""The issue's cases, end to end through `run_probe` on tiny offline models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probe.measurements import SCHEMA_VERSION
from probe.runner import run_probe
from tests.probe.conftest import by_path, job, weather_conversation

pytestmark = pytest.mark.probe


def test_dense_model_with_cache_safe_template_is_a_hit(model_dirs: dict[str, Path]) -> None:
    report = run_probe(job(model_dirs["llama/chatml"], repeats=2))
    json.dumps(report)  # the report goes over the broker as JSON
    assert report["schema_version"] == SCHEMA_VERSION
    for path in ("library", "library_checkpoints"):
        result = by_path(report)[(path, "forced")]
        assert result["verdict"] == "hit", result
        assert result["reused_share"] == 1.0
        assert not result["disagreement"]
        for pair in result["pairs"]:
            # The whole previous prompt + reply came back from the cache.
            assert pair["reused_tokens"] == pair["held_tokens"] == pair["reusable_tokens"]
            assert pair["correctness"]["ok"]
        repeat = result["exact_repeat"]
        assert repeat["reused_tokens"] == repeat["prompt_tokens"] - 1
        assert [layer["class"] for layer in result["cache_layers"]] == ["KVCache", "KVCache"]
        assert result["kv_snapshot_bytes"] > 0 and result["peak_memory_bytes"] > 0
        assert result["ttft_ratio"] is not None and result["ttft_ratio"] > 1.5


def test_dense_model_with_template_that_strips_reasoning_is_partial(
    model_dirs: dict[str, Path],
) -> None:
    result = by_path(run_probe(job(model_dirs["llama/qwen3"])))[("library", "forced")]
    assert result["verdict"] == "partial"
    assert 0.5 < result["reused_share"] < 1.0
    first = result["pairs"][0]
    # Reuse stops where the template dropped the <think> block the model had emitted...
    assert first["reused_tokens"] == first["reusable_tokens"] < first["held_tokens"]
    # ...and the engine lost nothing beyond what the template broke.
    assert not result["disagreement"]


@pytest.mark.parametrize("model", ["qwen3_next/qwen3", "llama_swa/qwen3"])
def test_non_trimmable_cache_misses_without_checkpoints(
    model_dirs: dict[str, Path], model: str
) -> None:
    results = by_path(run_probe(job(model_dirs[model])))
    plain = results[("library", "forced")]
    assert plain["verdict"] == "miss"
    assert all(p["reused_tokens"] == 0 for p in plain["pairs"])
    assert plain["exact_repeat"]["reused_tokens"] == 0
    # The template allowed reuse the engine could not deliver.
    assert plain["disagreement"] and plain["disagreement_kind"] == "engine_loses"
    assert not all(layer["trimmable"] for layer in plain["cache_layers"])

    # The batched server's checkpoints bring most of it back, and the answers stay right.
    checked = results[("library_checkpoints", "forced")]
    assert checked["verdict"] == "partial"
    assert checked["reused_share"] > 0.9
    repeat = checked["exact_repeat"]
    assert repeat["reused_tokens"] == repeat["prompt_tokens"] - 1
    assert repeat["correctness"]["ok"]


def test_hybrid_model_classes_are_reported(model_dirs: dict[str, Path]) -> None:
    report = run_probe(job(model_dirs["qwen3_next/qwen3"], paths=["library"]))
    classes = [layer["class"] for layer in report["model"]["cache_layers"]]
    assert classes == ["ArraysCache", "ArraysCache", "ArraysCache", "KVCache"]
    assert [layer["trimmable"] for layer in report["model"]["cache_layers"]][:3] == [False] * 3


@pytest.mark.parametrize("model", ["qwen3_next/qwen3", "llama_swa/qwen3"])
def test_suffix_only_client_on_untrimmable_cache_is_wrong(
    model_dirs: dict[str, Path], model: str
) -> None:
    result = by_path(run_probe(job(model_dirs[model], paths=["suffix_only_client"])))[
        ("suffix_only_client", "forced")
    ]
    assert result["verdict"] == "wrong"
    # It claims full reuse, which is exactly why only the logprob check can catch it.
    repeat = result["exact_repeat"]
    assert repeat["reused_tokens"] == repeat["prompt_tokens"] - 1
    assert not repeat["correctness"]["ok"]
    assert (
        repeat["correctness"]["max_abs_logprob_delta"]
        > result["exact_repeat"]["correctness"]["threshold"]
    )


def test_suffix_only_client_is_right_where_trim_works(model_dirs: dict[str, Path]) -> None:
    result = by_path(run_probe(job(model_dirs["llama/chatml"], paths=["suffix_only_client"])))[
        ("suffix_only_client", "forced")
    ]
    assert result["verdict"] == "hit"
    assert all(p["correctness"]["max_abs_logprob_delta"] < 1e-3 for p in result["pairs"])


def test_server_path_agrees_with_library_path(model_dirs: dict[str, Path]) -> None:
    report = run_probe(job(model_dirs["qwen3_next/qwen3"], paths=["server"]))
    results = by_path(report)
    server = results[("server", "generated")]
    assert server["error"] is None, server["error"]
    library = results[("library_checkpoints", "generated")]
    agreement = server["agrees_with"]
    assert agreement["agree"], agreement
    assert agreement["prompt_tokens_agree"]
    assert [p["reused_tokens"] for p in server["pairs"]] == [
        p["reused_tokens"] for p in library["pairs"]
    ]
    # Real reuse happened on the server: this is not 0 == 0.
    assert server["exact_repeat"]["reused_tokens"] == server["exact_repeat"]["prompt_tokens"] - 1
    assert server["verdict"] == library["verdict"]


def test_predictions_from_the_check_engine_raise_the_disagreement_flag(
    model_dirs: dict[str, Path],
) -> None:
    # A check engine that wrongly calls the reasoning-stripping template fully reusable.
    plain = job(model_dirs["llama/qwen3"], paths=["library"], prompt_sizes=[0])
    honest = by_path(run_probe(plain))[("library", "forced")]
    held = [p["held_tokens"] for p in honest["pairs"]]
    report = run_probe({**plain, "predicted": {"weather": held}})
    result = by_path(report)[("library", "forced")]
    assert result["predicted_source"] == "job"
    assert [p["predicted_tokens"] for p in result["pairs"]] == held
    assert result["disagreement"] and result["disagreement_kind"] == "engine_loses"


def test_predictions_are_shifted_by_the_padding(model_dirs: dict[str, Path]) -> None:
    base = job(model_dirs["llama/qwen3"], paths=["library"])
    plain = by_path(run_probe({**base, "prompt_sizes": [0]}))[("library", "forced")]
    predicted = [p["reusable_tokens"] for p in plain["pairs"]]
    padded = by_path(run_probe({**base, "predicted": {"weather": predicted}}))[
        ("library", "forced")
    ]
    assert padded["pairs"][0]["prompt_tokens"] > plain["pairs"][0]["prompt_tokens"] + 200
    assert [p["predicted_tokens"] for p in padded["pairs"]] == [
        p["reusable_tokens"] for p in padded["pairs"]
    ]
    assert not padded["disagreement"]


def test_several_prompt_sizes(model_dirs: dict[str, Path]) -> None:
    report = run_probe(job(model_dirs["llama/chatml"], paths=["library"], prompt_sizes=[0, 512]))
    sizes = {r["prompt_size"]: r for r in report["results"]}
    assert set(sizes) == {0, 512}
    small, large = sizes[0]["pairs"][0], sizes[512]["pairs"][0]
    assert large["prompt_tokens"] - small["prompt_tokens"] >= 450
    assert sizes[0]["verdict"] == sizes[512]["verdict"] == "hit"


def test_past_the_deadline_the_rest_is_skipped_not_lost(model_dirs: dict[str, Path]) -> None:
    conversations = {"first": weather_conversation(), "second": weather_conversation()}
    report = run_probe(
        job(
            model_dirs["llama/chatml"],
            paths=["library"],
            conversations=conversations,
            deadline_s=0.0,
        )
    )
    assert report["status"] == "ok"
    errors = [r["error"] for r in report["results"]]
    assert errors == ["skipped: job deadline of 0 s reached"] * 2


@pytest.mark.parametrize(
    "model", ["llama/chatml", "llama/qwen3", "qwen3_next/qwen3", "llama_swa/qwen3"]
)
def test_measured_reuse_agrees_with_the_cache_class_estimates(
    model_dirs: dict[str, Path], model: str
) -> None:
    """checks.reuse's rule for each cache class, fed the probe's own tokens, gives exactly what
    mlx-lm reused: trimmable on dense models, hybrid without and with checkpoints elsewhere."""
    results = by_path(run_probe(job(model_dirs[model])))
    expected = (
        {"library": "trimmable", "library_checkpoints": "trimmable"}
        if model.startswith("llama/")
        else {"library": "hybrid", "library_checkpoints": "hybrid_checkpoints"}
    )
    for path, cache_class in expected.items():
        result = results[(path, "forced")]
        assert result["cache_class"] == cache_class
        measured = [p["reused_tokens"] for p in result["pairs"]]
        assert [p["estimated_tokens"] for p in result["pairs"]] == measured, (path, result)
        repeat = result["exact_repeat"]
        assert repeat["estimated_tokens"] == repeat["reused_tokens"]
        assert result["estimate_agrees"] is True
    if not model.startswith("llama/"):
        # The classes really differ on these turns: checkpoints bring back what a plain hybrid
        # cache loses, and the estimate follows.
        plain = [p["estimated_tokens"] for p in results[("library", "forced")]["pairs"]]
        checked = [
            p["estimated_tokens"] for p in results[("library_checkpoints", "forced")]["pairs"]
        ]
        assert sum(checked) > sum(plain)
