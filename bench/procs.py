"""Resident memory of a process's children, read from /proc (Linux): what a worker really
holds after a benchmark, not what Python's allocator traced."""

from __future__ import annotations

import os
from pathlib import Path


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children_rss(pid: int) -> str:
    """'n processes, RSS min / median / max MiB' for the children of `pid` ('' off Linux)."""
    sizes = sorted(s for s in (rss_mib(c) for c in children(pid)) if s is not None)
    if not sizes:
        return ""
    median = sizes[len(sizes) // 2]
    return (
        f"{len(sizes)} processes, RSS {sizes[0]:.1f} / {median:.1f} / {sizes[-1]:.1f} MiB "
        "(min / median / max)"
    )


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as benches print them."""
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())
