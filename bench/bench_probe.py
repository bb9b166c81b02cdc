"""The probe's own overhead against bare `mlx_lm.stream_generate`, same tiny model and prompt.

Run: .venv/bin/python bench/bench_probe.py [--tokens 2000] [--repeats 11]
One request each way: a ~2k-token prompt from an empty cache, 8 greedy tokens. The probe
side is what it does per request: fetch from the LRU cache, prefill in the server's segments,
first token, reply, and store (with checkpoints: deep copies of the cache). Target: < 10 %.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_lm  # noqa: E402

from probe.library_path import LibraryEngine, ModelRunner, ReplyPlan  # noqa: E402
from probe.rendering import ChatRequest, render_prompt  # noqa: E402
from probe.runner import pad_requests  # noqa: E402
from probe.tinymodels import build_tiny_model  # noqa: E402

MAX_TOKENS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000, help="prompt size to aim for")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--arch", default="llama", help="tiny architecture (llama, qwen3_next…)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        built = build_tiny_model(Path(tmp) / "m", args.arch, "chatml")
        loaded: Any = mlx_lm.load(str(built.path))
        model, tokenizer = loaded[0], loaded[1]
    runner = ModelRunner(model, tokenizer)
    request = ChatRequest(
        [{"role": "system", "content": "Benchmark."}, {"role": "user", "content": "Hello?"}]
    )
    (padded,) = pad_requests([request], args.tokens - 20, tokenizer)
    prompt = render_prompt(tokenizer, padded)

    def bare() -> None:
        for _ in mlx_lm.stream_generate(model, tokenizer, prompt.tokens, max_tokens=MAX_TOKENS):
            pass

    def probe(checkpoints: bool) -> Callable[[], None]:
        def run() -> None:
            engine = LibraryEngine(runner, checkpoints=checkpoints)
            engine.serve(prompt, ReplyPlan(None, MAX_TOKENS))

        return run

    def floor() -> None:
        runner.cold(prompt.tokens)

    cases: dict[str, Callable[[], None]] = {
        "bare stream_generate": bare,
        "probe, sequential path": probe(False),
        "probe, with checkpoints": probe(True),
        # The model's own work, for scale: prefill and one token, nothing else.
        "floor: prefill + 1 token": floor,
    }
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # warm-up: the first call pays for kernel and allocator set-up
    # Interleaved, so drift in machine load hits every case alike. CPU time of this process is
    # reported too: on a shared machine it is far less noisy than wall time.
    for _ in range(args.repeats):
        for name, fn in cases.items():
            tic, cpu_tic = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - tic)
            cpu[name].append(time.process_time() - cpu_tic)

    print(f"model: tiny {args.arch}, prompt {len(prompt.tokens)} tokens, {MAX_TOKENS} generated")
    print(f"medians of {args.repeats}:{'wall':>28s}{'cpu':>21s}")
    base_wall, base_cpu = median(wall["bare stream_generate"]), median(cpu["bare stream_generate"])
    for name in cases:
        w, c = median(wall[name]), median(cpu[name])
        print(
            f"  {name:26s} {w * 1000:7.1f} ms {100 * (w / base_wall - 1):+6.1f} %"
            f"  {c * 1000:7.1f} ms {100 * (c / base_cpu - 1):+6.1f} %"
        )
    probes = [n for n in cases if n.startswith("probe")]
    worst = max(median(cpu[n]) for n in probes) / base_cpu - 1
    verdict = "ok" if worst < 0.10 else "OVER"
    print(f"worst probe overhead (cpu time) {100 * worst:+.1f} % (target < 10 %): {verdict}")


if __name__ == "__main__":
    main()
