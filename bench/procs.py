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


def shared_mib(pid: int) -> tuple[float, float] | None:
    """(PSS, private) MiB of `pid`: its share of the pages it shares with other processes (a
    forked worker with its master and siblings), and the pages no other process maps."""
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0])
    except OSError:
        return None
    private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return fields.get("Pss", 0) / 1024, private / 1024


def _spread(name: str, sizes: list[float]) -> str:
    sizes = sorted(sizes)
    return f"{name} {sizes[0]:.1f} / {sizes[len(sizes) // 2]:.1f} / {sizes[-1]:.1f}"


def children_rss(pid: int) -> str:
    """'n processes, RSS min / median / max MiB' for the children of `pid` ('' off Linux),
    with their PSS and private memory where /proc has them."""
    pids = children(pid)
    sizes = [s for s in (rss_mib(c) for c in pids) if s is not None]
    if not sizes:
        return ""
    shares = [s for s in (shared_mib(c) for c in pids) if s is not None]
    text = f"{len(sizes)} processes, {_spread('RSS', sizes)}"
    if shares:
        text += f", {_spread('PSS', [s[0] for s in shares])}"
        text += f", {_spread('private', [s[1] for s in shares])}"
    text += " MiB (min / median / max)"
    parent = shared_mib(pid)
    if shares and parent is not None:
        # What the whole server holds: forked children share pages with it and each other,
        # which RSS counts in full in every process and PSS divides among them.
        text += f"; with the parent, PSS {parent[0] + sum(s[0] for s in shares):.1f} MiB in all"
    return text


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as benches print them."""
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())
