"""Run the fake Hub as a process: `python -m tests.fakehub --port 8765 --corpus ../shared/corpus`.

Prints `ready <url> <repos>` once it listens, then serves until interrupted. `--repos N`
serves N generated repos (for the benchmark) instead of one repo per corpus repo id;
`--derivatives` adds MLX, GGUF and fine-tuned derivatives of every corpus repo (discovery).
`GET /_fakehub/stats` returns request counts; `POST /_fakehub/reset-log` clears them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .corpus import build_corpus_hub, build_scaled_hub
from .derived import build_discovery_hub
from .server import FakeHub


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakehub", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--corpus", type=Path, required=True, help="the shared corpus folder")
    parser.add_argument("--repos", type=int, default=0, help="serve N generated repos")
    parser.add_argument(
        "--derivatives", action="store_true", help="add derivatives of every corpus repo"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=0, help="wait this long before every answer"
    )
    args = parser.parse_args(argv)
    if not (args.corpus / "index.json").is_file():
        print(f"error: no index.json in {args.corpus}", file=sys.stderr)
        return 2
    hub = FakeHub(port=args.port)
    hub.state.latency = args.latency_ms / 1000
    if args.repos:
        count = len(build_scaled_hub(hub.store, args.corpus, args.repos))
    elif args.derivatives:
        count = build_discovery_hub(hub.store, args.corpus)
    else:
        count = build_corpus_hub(hub.store, args.corpus, include_unnamed=True)
    print(f"ready {hub.url} {count}", flush=True)
    try:
        hub.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
