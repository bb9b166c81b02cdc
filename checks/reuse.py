"""How much of the next request each kind of engine cache reuses (docs/engine.md, "Engine caches").

Pure functions over sequences (token ids when a tokenizer is known, else characters): the check
engine estimates with them, and the Mac probe compares the same estimates with what mlx-lm
really reused on the same tokens.

An engine keeps, after each request, the sequence it processed: the prompt plus the reply it
generated (`Stored.sequence`). Some engines also keep snapshots part way (`Stored.checkpoints`,
lengths into the sequence). For the next prompt:

- `trimmable` (attention KV caches: mlx-lm and llama.cpp on dense models) trims a stored sequence
  back to where it parts from the prompt: the longest common prefix with any stored sequence.
- `block` (vLLM's automatic prefix caching, SGLang's pages) keeps whole blocks only: the same,
  rounded down to a multiple of the block size (16 tokens by default).
- `hybrid` (recurrent or sliding-window layers, no checkpoints: mlx-lm's sequential server path,
  llama.cpp without context checkpoints) cannot trim: a stored sequence counts only when all of it
  is a prefix of the prompt.
- `hybrid_checkpoints` (mlx-lm's batched server, llama.cpp with context checkpoints): the same,
  or any checkpoint whose part of the sequence is a prefix of the prompt.

Every engine computes at least the prompt's last token, so reuse is capped at len(prompt) - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TRIMMABLE = "trimmable"
BLOCK = "block"
HYBRID = "hybrid"
HYBRID_CHECKPOINTS = "hybrid_checkpoints"
CACHE_CLASSES = (TRIMMABLE, BLOCK, HYBRID, HYBRID_CHECKPOINTS)
DEFAULT_BLOCK_SIZE = 16

#: What each class is, in the words the pages and the CLI use.
CACHE_CLASS_LABELS = {
    TRIMMABLE: "Trimmable cache (mlx-lm, llama.cpp; dense models)",
    BLOCK: "Block cache (vLLM, SGLang)",
    HYBRID: "Hybrid model, no checkpoints (mlx-lm sequential path, llama.cpp without checkpoints)",
    HYBRID_CHECKPOINTS: "Hybrid model with checkpoints (mlx_lm.server batched, llama.cpp)",
}


@dataclass(frozen=True)
class Stored:
    """What an engine kept after one request: the sequence, and lengths it checkpointed."""

    sequence: Sequence[Any]
    checkpoints: tuple[int, ...] = ()


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    if isinstance(a, str) and isinstance(b, str):
        if b.startswith(a[:n]):
            return n
        low, high = 0, n
        while low < high:  # binary search on slice equality: fast in CPython
            mid = (low + high + 1) // 2
            if a[:mid] == b[:mid]:
                low = mid
            else:
                high = mid - 1
        return low
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def reused(
    cache_class: str,
    stored: Sequence[Stored],
    prompt: Sequence[Any],
    block_size: int = DEFAULT_BLOCK_SIZE,
    shared_prefixes: Sequence[int] | None = None,
) -> int:
    """Units of `prompt` an engine of `cache_class` takes from its cache instead of computing.

    `shared_prefixes`, when given, are the common prefix lengths of each stored sequence with
    the prompt (`shared_prefixes_with`): computed once for every cache class."""
    limit = max(len(prompt) - 1, 0)
    best = 0
    if shared_prefixes is None:
        shared_prefixes = shared_prefixes_with(stored, prompt)
    for entry, shared in zip(stored, shared_prefixes, strict=True):
        if cache_class in (TRIMMABLE, BLOCK):
            best = max(best, shared)
            continue
        if cache_class not in (HYBRID, HYBRID_CHECKPOINTS):
            raise ValueError(f"unknown cache class {cache_class!r}")
        lengths = [len(entry.sequence)]
        if cache_class == HYBRID_CHECKPOINTS:
            lengths += list(entry.checkpoints)
        usable = [n for n in lengths if n <= shared and n <= limit]
        best = max(best, *usable) if usable else best
    best = min(best, limit)
    if cache_class == BLOCK:
        best -= best % block_size
    return best


def shared_prefixes_with(stored: Sequence[Stored], prompt: Sequence[Any]) -> list[int]:
    return [common_prefix(entry.sequence, prompt) for entry in stored]


def reused_by_class(
    stored: Sequence[Stored], prompt: Sequence[Any], block_size: int = DEFAULT_BLOCK_SIZE
) -> dict[str, int]:
    shared = shared_prefixes_with(stored, prompt)
    return {c: reused(c, stored, prompt, block_size, shared) for c in CACHE_CLASSES}


def bar(
    cache_class: str,
    held: Stored,
    prompt_length: int,
    next_length: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> int:
    """What `cache_class` must reuse of the next request for a turn to cost at most the reply.

    `held` is what request k left (its prompt, `prompt_length` long, then the reply); the next
    request is `next_length` long. A trimmable or block cache keeps request k's prompt whatever
    happens to the reply; a hybrid without checkpoints keeps only a whole stored sequence, so the
    reply must carry over too; with checkpoints it falls back to the last one inside the prompt.
    A turn that reuses less lost more than the reply's tokens on that engine.
    """
    limit = max(next_length - 1, 0)
    if cache_class == HYBRID:
        return min(len(held.sequence), limit)
    if cache_class == HYBRID_CHECKPOINTS:
        inside = [c for c in held.checkpoints if c <= prompt_length]
        return min(max(inside, default=0), limit)
    n = min(prompt_length, limit)
    return n - n % block_size if cache_class == BLOCK else n
