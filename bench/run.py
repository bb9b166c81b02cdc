"""Run the benchmarks: `make bench` runs all of them, `make bench BENCH=checks` just one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    names = argv or os.environ.get("BENCH", "").split()
    scripts = (
        [HERE / f"bench_{name}.py" for name in names] if names else sorted(HERE.glob("bench_*.py"))
    )
    missing = [s.name for s in scripts if not s.is_file()]
    if missing:
        print(f"no such benchmark: {', '.join(missing)}", file=sys.stderr)
        return 2
    failed = 0
    for script in scripts:
        print(f"\n=== {script.stem.removeprefix('bench_')} ===", flush=True)
        failed += subprocess.call([sys.executable, str(script)], cwd=HERE.parent) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
