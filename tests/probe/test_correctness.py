"""The log-probability comparison that decides `wrong`."""

from __future__ import annotations

import mlx.core as mx

from probe.correctness import compare_logprobs


def logprobs(values: list[float]) -> mx.array:
    x = mx.array(values)
    return x - mx.logsumexp(x, keepdims=True)


def test_identical_is_ok() -> None:
    cold = logprobs([1.0, 2.0, 3.0])
    result = compare_logprobs(cold, cold)
    assert (result.ok, result.same_greedy, result.max_abs_delta) == (True, True, 0.0)


def test_near_tie_that_flips_the_argmax_is_not_wrong() -> None:
    cold, warm = logprobs([3.0, 3.001, 0.0]), logprobs([3.001, 3.0, 0.0])
    result = compare_logprobs(cold, warm)
    assert not result.same_greedy
    assert result.ok and result.max_abs_delta < 0.01


def test_a_moved_distribution_is_wrong() -> None:
    result = compare_logprobs(logprobs([3.0, 1.0, 0.0]), logprobs([3.0, 1.0, 0.5]), threshold=0.1)
    assert result.same_greedy  # the argmax alone would have missed it
    assert not result.ok and result.max_abs_delta > 0.1
