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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_lm  # noqa: E402

from workers.probe.library_path import LibraryEngine, ModelRunner, ReplyPlan  # noqa: E402
from workers.probe.rendering import ChatRequest, render_prompt  # noqa: E402
from workers.probe.runner import pad_requests  # noqa: E402
from workers.probe.tinymodels import build_tiny_model  # noqa: E402

MAX_TOKENS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000, help="prompt size to aim for")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--arch", default="llama", help="tiny architecture (llama, qwen3_next…)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        built = build_tiny_model(Path(tmp) / "m", args.arch, "chatml")
        model, tokenizer = mlx_lm.load(str(built.path))
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
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # warm-up: the first call pays for kernel and allocator set-up
    # Interleaved, so drift in machine load hits every case alike.
    for _ in range(args.repeats):
        for name, fn in cases.items():
            tic = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - tic)

    base = median(times["bare stream_generate"])
    print(f"model: tiny {args.arch}, prompt {len(prompt.tokens)} tokens, {MAX_TOKENS} generated")
    print(f"repeats: {args.repeats} (medians)")
    for name, values in times.items():
        m = median(values)
        print(f"  {name:26s} {m * 1000:8.1f} ms  overhead {100 * (m / base - 1):+6.1f} %")
    worst = max(median(times[n]) for n in cases if n.startswith("probe")) / base - 1
    print(
        f"worst overhead {100 * worst:+.1f} % (target < 10 %): {'ok' if worst < 0.10 else 'OVER'}"
    )


if __name__ == "__main__":
    main()
