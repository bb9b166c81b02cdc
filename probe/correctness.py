"""Does a restored cache give the same answer as a cold prefill? And a client that gets it wrong.

Compare log-probabilities, not only greedy tokens: a wrong recurrent state can leave the
argmax unchanged on a random-weight model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

from probe.library_path import ModelRunner, ReplyPlan, ServedRequest, cache_layers
from probe.rendering import RenderedPrompt, common_prefix

#: Max |warm - cold| log-probability over the cold top tokens, in nats. A wrong cache measured
#: here moves it by 0.5-5; a correct one by < 1e-4 in float32 on the CPU. Quantized models on
#: Metal move it more, hence a margin.
DEFAULT_THRESHOLD = 0.1
TOP_K = 20


@dataclass(frozen=True)
class LogprobComparison:
    """How far warm log-probabilities are from cold ones."""

    max_abs_delta: float
    same_greedy: bool
    threshold: float

    @property
    def ok(self) -> bool:
        # The threshold alone decides: a flipped argmax with a tiny delta is a near-tie (bf16 on
        # Metal, other chunking), while a wrong cache moves log-probabilities by whole nats.
        return self.max_abs_delta <= self.threshold


def compare_logprobs(
    cold: Any, warm: Any, threshold: float = DEFAULT_THRESHOLD, top_k: int = TOP_K
) -> LogprobComparison:
    """Compare on the cold distribution's top-k tokens, where a changed answer would show."""
    import mlx.core as mx

    top = mx.argsort(-cold)[:top_k]
    delta = cast(float, mx.max(mx.abs(cold[top] - warm[top])).item())
    same = mx.argmax(cold).item() == mx.argmax(warm).item()
    return LogprobComparison(float(delta), bool(same), threshold)


class SuffixOnlyClient:
    """A deliberately wrong client: one cache, trims it, ignores that the trim returned 0.

    It then prefills only the new suffix, as if the cache held exactly the common prefix. On a
    cache that cannot trim (recurrent or full sliding-window layers) the state still holds the
    old reply, and the answer changes: the probe must call that `wrong`.
    """

    name = "suffix_only_client"

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.cache: list[Any] | None = None
        self.held: list[int] = []
        self.last_layers: list[dict[str, Any]] = []
        self.trim_returned: list[int] = []

    def serve(self, prompt: RenderedPrompt, plan: ReplyPlan, store: bool = True) -> ServedRequest:
        """Serve like a naive client; with `store=False` the held cache is left untouched."""
        import copy

        from mlx_lm.models.cache import trim_prompt_cache

        tokens = prompt.tokens
        tic = time.perf_counter()
        reused, trimmed = 0, 0
        if self.cache is None:
            cache = self.runner.new_cache()
        else:
            cache = copy.deepcopy(self.cache)
            reused = min(common_prefix(self.held, tokens), len(tokens) - 1)
            # Annotated upstream as a list; it returns the number of tokens trimmed.
            trimmed = int(cast(Any, trim_prompt_cache(cache, len(self.held) - reused)))
        if store:
            self.trim_returned.append(int(trimmed))
        self.runner.prefill(cache, tokens[reused:-1])
        logprobs = self.runner.step(cache, tokens[-1:])
        served = ServedRequest(len(tokens), reused, time.perf_counter() - tic, logprobs)
        if store:
            self.runner.finish(cache, served, plan)
            self.last_layers = cache_layers(cache)
            self.cache, self.held = cache, tokens + served.reply
        return served
