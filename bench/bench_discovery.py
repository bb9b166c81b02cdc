"""Benchmark: one discovery run against a fake Hub of a few hundred repos (the corpus's bases
and their MLX, GGUF and fine-tuned derivatives), then the bytes a GGUF header costs.

Prints, counted at the fake Hub: the requests per new repo by format, the range requests and
bytes read per GGUF file, the wall time of the first syncs at 1 and 4 at a time, and a second
sync where nothing changed. Then, for vocabularies of real sizes, how many bytes and range
requests reading a GGUF header takes (the vocabulary comes before the template).
`.venv/bin/python bench/bench_discovery.py`
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench_sync import hub_stats, isolate, reset_log, start_hub  # noqa: E402
from procs import load_average  # noqa: E402


def per_repo(url: str) -> dict[str, int]:
    found = hub_stats(url)["per_repo"]
    assert isinstance(found, dict)
    return {str(k): int(v) for k, v in found.items()}


def header_costs() -> list[str]:
    """Bytes and range requests to read the template of GGUF files with real vocabularies."""
    from registry.gguf_header import read_metadata
    from tests.gguf_files import gguf_bytes

    lines = []
    for label, size in (
        ("32k (Llama 2)", 32_000),
        ("152k (Qwen3)", 151_936),
        ("262k (Gemma 3)", 262_144),
    ):
        tokens = [f"tok{i:06d}\u0120x" for i in range(size)]
        header = gguf_bytes("{{ messages }}" * 400, tokens=tokens)
        asked: list[int] = []

        def fetch(start: int, length: int, data: bytes = header, asked: list[int] = asked) -> bytes:
            asked.append(length)
            # Past the header a real file holds gigabytes of weights: zeros stand in for them.
            end = start + length
            return data[start:end] + b"\0" * max(0, end - max(start, len(data)))

        started = time.perf_counter()
        meta = read_metadata(fetch, 32 << 20)
        seconds = time.perf_counter() - started
        lines.append(
            f"  {label:16} header {meta.header_bytes / 2**20:5.1f} MiB, read "
            f"{meta.bytes_read / 2**20:5.1f} MiB in {len(asked)} range requests, "
            f"parsed in {seconds * 1000:.0f} ms"
        )
    return lines


def main() -> int:
    hub, url = start_hub("--derivatives")
    isolate("discovery", url, DISCOVERY_LIMIT="1000")
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from registry import discovery
        from registry.models import DiscoveryRun, HubModel, Watch
        from registry.sync import backfill_histories, sync_repo_ids

        call_command("migrate", verbosity=0)
        print(f"load average at start         {load_average()}")
        results = {}
        for concurrency in (1, 4):
            HubModel.objects.all().delete()
            DiscoveryRun.objects.all().delete()
            reset_log(url)
            started = time.perf_counter()
            run = discovery.discover(trigger="command", queue_syncs=False)
            listed = time.perf_counter() - started
            listing_requests = Watch.objects.filter(discovery=True).count()
            reset_log(url)
            started = time.perf_counter()
            synced = discovery.sync_new(run, concurrency=concurrency)
            results[concurrency] = (time.perf_counter() - started, listed, listing_requests, synced)
        seconds, listed, listing_requests, synced = results[4]
        failed = [r for r in synced if r.outcome == "failed"]
        counts = per_repo(url)
        models = list(HubModel.objects.all())
        by_format: dict[str, list[int]] = {}
        for model in models:
            by_format.setdefault(model.format or "other", []).append(counts.get(model.repo_id, 0))
        print(f"repos listed by discovery     {run.listed} ({run.new} new) in {listed:.2f} s, "
              f"{listing_requests} Hub queries of one page each")  # fmt: skip
        for concurrency, (wall, _, _, done) in sorted(results.items()):
            print(f"first syncs, {concurrency} at a time      {wall:6.2f} s "
                  f"({len(done) / wall:.0f} repos/s)")  # fmt: skip
        print(f"  ratio 1 / 4 at a time       {results[1][0] / results[4][0]:.2f}x")
        for name, numbers in sorted(by_format.items()):
            print(f"requests per new {name:12} median {statistics.median(numbers):.0f}, "
                  f"max {max(numbers)} ({len(numbers)} repos)")  # fmt: skip
        files = [e for m in models for e in m.gguf_files]
        read = [e["bytes"] for e in files if e["bytes"]]
        print(f"GGUF files listed             {len(files)} in "
              f"{sum(m.format == 'gguf' for m in models)} repos; "
              f"{sum(e['status'] == 'broken' for e in files)} broken")  # fmt: skip
        sizes = [e["size"] for e in files]
        print(f"bytes read per GGUF file      median {statistics.median(read):.0f}, "
              f"max {max(read)} (the test files are {min(sizes)}-{max(sizes)} bytes)")  # fmt: skip
        drift = Counter(HubModel.objects.exclude(drift="").values_list("drift", flat=True))
        print(f"drift after the first syncs   {dict(sorted(drift.items()))}")
        reset_log(url)
        started = time.perf_counter()
        backfilled = backfill_histories(len(models))
        seconds = time.perf_counter() - started
        requests = sum(per_repo(url).values())
        print(f"history backfill              {seconds:6.2f} s, {len(backfilled)} repos, "
              f"{requests / max(1, len(backfilled)):.1f} requests per repo")  # fmt: skip
        drift = Counter(HubModel.objects.exclude(drift="").values_list("drift", flat=True))
        print(f"drift after the backfill      {dict(sorted(drift.items()))}")
        reset_log(url)
        started = time.perf_counter()
        again = sync_repo_ids(None)
        warm = time.perf_counter() - started
        warm_requests = sum(per_repo(url).values())
        print(f"second sync, nothing changed  {warm:6.2f} s, {warm_requests / len(again):.2f} "
              "requests per repo")  # fmt: skip
        print("GGUF headers of real sizes (32 MiB cap, ranges from 256 KiB doubling to 8 MiB):")
        for line in header_costs():
            print(line)
        print(f"load average at end           {load_average()}")
        if failed:
            print(f"FAILED: {len(failed)} sync(s), e.g. {failed[0].line()}", file=sys.stderr)
            return 1
        return 0
    finally:
        hub.terminate()
        hub.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
