"""The check CLI against a bare render loop, in the same run: `make bench BENCH=cli`.

1. `python -m checks CORPUS`, as a user runs it: a fresh process each round (no result cache),
   every variant, client profile and engine class, the sandbox pool, comparison and line
   attribution included, printing its table; and again with `--json` into a pipe. Wall time,
   and CPU of the CLI and its workers.
2. A bare loop in one process that only renders: the same templates, each compiled once by a
   plain Jinja sandbox configured as transformers does, and the same renders (the engine's,
   recorded once beforehand with their contexts built, so the loop times compile and render
   only). Wall time and CPU.

Rounds alternate the two, so both see the same machine; medians and the ratio of medians are
printed with the load average. Renders are counted, not assumed: the CLI's reports carry their
render counts, and the loop renders exactly the recorded ones.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from checks import CheckInput  # noqa: E402
from checks.cli import collect_inputs  # noqa: E402
from checks.engine import RenderCall, run_check  # noqa: E402
from checks.rendering import CheckEnvironment, GenerationExtension, TemplateCache  # noqa: E402

CORPUS = ROOT / ".." / "shared" / "corpus" / "templates"

Job = tuple[str, list[tuple[str, dict[str, Any]]]]


def recorded_renders(items: list[CheckInput]) -> tuple[list[Job], int]:
    """Per template: its named templates' text and every render the engine asks for, with the
    context transformers would build (prepared here, outside the timed loop)."""
    jobs: list[Job] = []
    count = 0
    for item in items:
        assert item.source is not None, item.source_error
        source = item.source
        calls: list[RenderCall] = []
        run_check(source, TemplateCache(CheckEnvironment()), observer=calls.append)
        renders = []
        for call in calls:
            context = call.context(source.special_tokens)
            renders.append((source.templates[call.template_name], context))
        jobs.append((source.sha256, renders))
        count += len(renders)
    return jobs, count


def bare_environment() -> ImmutableSandboxedEnvironment:
    """A plain Jinja sandbox with transformers' settings and globals, nothing of ours."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationExtension, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, **kw: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, **kw
    )

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    return environment


def bare_loop(jobs: list[Job]) -> tuple[float, float, int, int]:
    """(wall s, CPU s, renders, renders the template refused): compile once, render each."""
    environment = bare_environment()
    renders = refused = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for _, calls in jobs:
        compiled: dict[str, jinja2.Template | None] = {}
        for text, context in calls:
            if text not in compiled:
                try:
                    compiled[text] = environment.from_string(text)
                except jinja2.TemplateSyntaxError:
                    compiled[text] = None
            template = compiled[text]
            renders += 1
            if template is None:
                refused += 1
                continue
            try:
                template.render(context)
            except Exception:  # noqa: BLE001 - a template refusing a conversation is a render too
                refused += 1
    return time.perf_counter() - wall, time.process_time() - cpu, renders, refused


def run_cli(paths: list[Path], extra: list[str]) -> tuple[float, float, bytes]:
    """(wall s, CPU s of the CLI and its sandbox workers, what it printed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "checks", *map(str, paths), *extra],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"the CLI failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("paths", nargs="*", type=Path, default=[CORPUS])
    args = parser.parse_args()
    if not all(p.exists() for p in args.paths):
        print(f"no corpus at {CORPUS}: pass template paths")
        return 0
    items = collect_inputs(args.paths, None)
    jobs, recorded = recorded_renders(items)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"{len(items)} templates, {recorded} renders recorded, {args.rounds} rounds, "
        f"{os.cpu_count()} cores, load average {load}"
    )
    cli_wall, cli_cpu, json_wall, json_cpu, loop_wall, loop_cpu = [], [], [], [], [], []
    renders = refused = 0
    results: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        wall, cpu, renders, refused = bare_loop(jobs)
        loop_wall.append(wall)
        loop_cpu.append(cpu)
        wall, cpu, _ = run_cli(args.paths, [])
        cli_wall.append(wall)
        cli_cpu.append(cpu)
        wall, cpu, printed = run_cli(args.paths, ["--json"])
        json_wall.append(wall)
        json_cpu.append(cpu)
        results = json.loads(printed)["results"]
    assert renders == recorded
    cli_renders = sum(int(r.get("renders", 0)) for r in results)
    verdicts: dict[str, int] = {}
    for result in results:
        verdicts[result["verdict"]] = verdicts.get(result["verdict"], 0) + 1
    median = statistics.median
    print(
        f"bare loop (one process, compile + render)  wall {median(loop_wall):5.2f} s   "
        f"CPU {median(loop_cpu):5.2f} s   {renders} renders ({refused} refused by the template), "
        f"{median(loop_cpu) / renders * 1e6:5.0f} us CPU a render"
    )
    print(
        f"CLI (fresh process, sandbox pool)          wall {median(cli_wall):5.2f} s   "
        f"CPU {median(cli_cpu):5.2f} s   {cli_renders} renders, "
        f"{median(cli_cpu) / max(cli_renders, 1) * 1e6:5.0f} us CPU a render, everything included"
    )
    print(
        f"CLI --json into a pipe                     wall {median(json_wall):5.2f} s   "
        f"CPU {median(json_cpu):5.2f} s"
    )
    for label, walls in (("CLI", cli_wall), ("CLI --json", json_wall)):
        ratios = sorted(c / b for c, b in zip(walls, loop_wall, strict=True))
        print(
            f"{label} / bare loop, wall: {median(walls) / median(loop_wall):.2f}x (medians); "
            f"per round {', '.join(f'{r:.2f}' for r in ratios)}"
        )
    print(f"verdicts: {dict(sorted(verdicts.items()))}")
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"load average at the end {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
