"""mlx-lm's own prompt-cache logic, driven the way `mlx_lm.server` drives it.

`LibraryEngine(checkpoints=True)` follows the batched server (`BatchGenerator` segments: a
cache checkpoint at the end of the system prompt, of the user context and at `prompt[:-1]`);
`checkpoints=False` follows its sequential path (requests with `seed`, `--kv-bits`, a draft
model). Both fetch from and store into a real `LRUPromptCache`, keyed on prompt + reply.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, cast

from probe.rendering import RenderedPrompt

#: The server's defaults (`--prefill-step-size`, `--prompt-cache-size`): eviction is part of
#: what a real server does to a long conversation's checkpoints.
PREFILL_STEP_SIZE = 2048
PROMPT_CACHE_SIZE = 10


@dataclass(frozen=True)
class ReplyPlan:
    """What the engine emits after a request: forced tokens, or up to `max_tokens` greedy ones."""

    forced: list[int] | None = None
    max_tokens: int = 8


@dataclass
class ServedRequest:
    """What one request cost and what the engine reused for it."""

    prompt_tokens: int
    reused_tokens: int
    ttft_s: float
    logprobs: Any  # mx.array (vocab,): the first generated token's log-probabilities
    reply: list[int] = field(default_factory=list)
    kv_bytes: int = 0
    note: str = ""
    checkpoints: list[int] = field(default_factory=list)  # lengths stored as checkpoints


def cache_layers(cache: list[Any]) -> list[dict[str, Any]]:
    """Per layer: cache class, whether it can trim now, and its bytes."""
    return [
        {"class": type(c).__name__, "trimmable": bool(c.is_trimmable()), "bytes": _nbytes(c)}
        for c in cache
    ]


def _nbytes(c: Any) -> int:
    try:
        return int(c.nbytes)
    except (NotImplementedError, AttributeError, TypeError):
        return 0


def cache_bytes(cache: list[Any]) -> int:
    """Bytes a snapshot of this cache holds (keys, values, recurrent state)."""
    return sum(_nbytes(c) for c in cache)


class ModelRunner:
    """Forward passes on a cache, in the server's chunk sizes."""

    def __init__(self, model: Any, tokenizer: Any, prefill_step_size: int = PREFILL_STEP_SIZE):
        self.model = model
        self.tokenizer = tokenizer
        self.prefill_step_size = prefill_step_size
        self.eos = {int(t) for t in tokenizer.eos_token_ids}

    def new_cache(self) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        return list(make_prompt_cache(self.model))

    def prefill(self, cache: list[Any], tokens: list[int]) -> None:
        """Process tokens into the cache without sampling (prompt processing)."""
        import mlx.core as mx

        for start in range(0, len(tokens), self.prefill_step_size):
            chunk = mx.array(tokens[start : start + self.prefill_step_size])[None]
            self.model(chunk, cache=cache)
            mx.eval([c.state for c in cache])

    def step(self, cache: list[Any], tokens: list[int]) -> Any:
        """Feed tokens, return the next token's log-probabilities (evaluated)."""
        import mlx.core as mx

        logits = self.model(mx.array(tokens)[None], cache=cache)[0, -1, :]
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        mx.eval(logprobs)
        return logprobs

    def cold(self, tokens: list[int]) -> tuple[float, Any]:
        """Time to first token from an empty cache, and that token's log-probabilities."""
        tic = time.perf_counter()
        cache = self.new_cache()
        self.prefill(cache, tokens[:-1])
        logprobs = self.step(cache, tokens[-1:])
        return time.perf_counter() - tic, logprobs

    def finish(self, cache: list[Any], served: ServedRequest, plan: ReplyPlan) -> None:
        """Put the reply into the cache, as generation would: every emitted token is fed."""
        import mlx.core as mx

        if plan.forced is not None:
            self.prefill(cache, plan.forced)
            served.reply = list(plan.forced)
        else:
            logprobs = served.logprobs
            while len(served.reply) < plan.max_tokens:
                token = int(cast(int, mx.argmax(logprobs).item()))
                served.reply.append(token)
                logprobs = self.step(cache, [token])
                if token in self.eos:
                    break
        served.kv_bytes = cache_bytes(cache)


class LibraryEngine:
    """An `LRUPromptCache` served like `mlx_lm.server`, with or without its checkpoints."""

    def __init__(
        self, runner: ModelRunner, *, checkpoints: bool, cache_size: int = PROMPT_CACHE_SIZE
    ):
        from mlx_lm.models.cache import LRUPromptCache

        self.runner = runner
        self.checkpoints = checkpoints
        self.lru = LRUPromptCache(max_size=cache_size)
        self.model_key = ("probe-model", None, None)
        self.last_layers: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        return "library_checkpoints" if self.checkpoints else "library"

    def serve(self, prompt: RenderedPrompt, plan: ReplyPlan, store: bool = True) -> ServedRequest:
        """Serve one request; with `store=False` nothing is inserted (a timing repeat)."""
        tokens = prompt.tokens
        tic = time.perf_counter()
        cache, rest = self.lru.fetch_nearest_cache(self.model_key, tokens)
        reused = len(tokens) - len(rest)
        note = ""
        if not rest:
            # The server cannot serve this shape (empty prompt after the cache): recompute.
            note = "prompt equals a stored key: mlx_lm.server fails on this shape"
            cache, reused = None, 0
        if cache is None:
            cache = self.runner.new_cache()
        pieces, types = self._pieces(prompt, reused)
        done = tokens[:reused]
        marks = []
        for piece in pieces[:-1]:
            self.runner.prefill(cache, piece)
            done = done + piece
            if store and self.checkpoints and types:
                self.lru.insert_cache(
                    self.model_key, list(done), copy.deepcopy(cache), cache_type=types.pop(0)
                )
                marks.append(len(done))
        logprobs = self.runner.step(cache, pieces[-1])
        ttft = time.perf_counter() - tic
        served = ServedRequest(len(tokens), reused, ttft, logprobs, note=note, checkpoints=marks)
        if store:
            self.runner.finish(cache, served, plan)
            self.last_layers = cache_layers(cache)
            self.lru.insert_cache(self.model_key, tokens + served.reply, cache)
        return served

    def _pieces(self, prompt: RenderedPrompt, reused: int) -> tuple[list[list[int]], list[str]]:
        """What is left to process, cut where the server would stop and checkpoint."""
        rest = prompt.tokens[reused:]
        if not self.checkpoints:
            # Sequential path: one prefill, the last token is the first decode step.
            return ([rest[:-1], rest[-1:]] if len(rest) > 1 else [rest]), []
        segments = [list(s) for s in prompt.segments] or [list(prompt.tokens)]
        types = list(prompt.segment_types) or ["assistant"]
        n = reused
        # The server's own loop: drop what the cache covers, segment by segment.
        while n > 0 and segments:
            if n >= len(segments[0]):
                n -= len(segments.pop(0))
                types.pop(0)
            else:
                segments[0] = segments[0][n:]
                break
        pieces = [s for s in segments if s]
        if len(pieces[-1]) != 1:
            pieces.append(pieces[-1][-1:])
            pieces[-2] = pieces[-2][:-1]
        return pieces, types
