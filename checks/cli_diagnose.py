"""`python -m checks diagnose REQUESTS... --template PATH [--json]`: why did my cache miss?"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from checks import RequestError, SandboxLimits, SandboxPool, diagnose_requests, read_requests
from checks.sandbox import DEFAULT_CPU_SECONDS, SandboxError, cpu_budget


class UsageError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m checks diagnose",
        description="Compare each request a client sent with the next one and say why a prefix "
        "cache missed: the client's change, or the template's.",
    )
    parser.add_argument(
        "requests",
        nargs="+",
        metavar="REQUESTS",
        type=Path,
        help="JSON request bodies (OpenAI chat completions or Anthropic messages), a JSON list "
        "of them, or JSON Lines, in the order they were sent",
    )
    parser.add_argument(
        "--template",
        required=True,
        type=Path,
        help="a .jinja file, a tokenizer_config.json or a model repository folder",
    )
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json: reuse counted in tokens")
    parser.add_argument("--json", action="store_true", help='print {"pairs": [...]} as JSON')
    parser.add_argument(
        "--cpu-seconds",
        type=cpu_budget,
        default=DEFAULT_CPU_SECONDS,
        help="CPU seconds per 20 requests",
    )
    return parser


def load_template(path: Path, tokenizer: Path | None) -> tuple[Any, str | None]:
    """The template source at `path` and the tokenizer.json to count tokens with, if any."""
    from checks.cli import UsageError as CheckUsage
    from checks.cli import collect_inputs

    tokenizer_json = None
    if tokenizer is not None:
        try:
            tokenizer_json = tokenizer.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read tokenizer {tokenizer}: {exc}") from None
    try:
        items = collect_inputs([path], tokenizer_json)
    except CheckUsage as exc:
        raise UsageError(str(exc)) from None
    if len(items) != 1:
        raise UsageError(f"{path}: give one template (found {len(items)})")
    (item,) = items
    if item.source is None:
        raise UsageError(f"{path}: {item.source_error}")
    return item.source, item.tokenizer_json


def print_pairs(pairs: Sequence[dict[str, Any]], out: IO[str]) -> None:
    out.write(f"{'REQUESTS':<9} {'REUSE':>6}  {'CAUSE':<18} WHERE, AND WHAT TO DO\n")
    for pair in pairs:
        head = f"{pair['from']} → {pair['to']}"
        share = f"{round(pair['prompt_reuse'] * 100)}%"
        where = pair["where"]
        lines = [pair["detail"]]
        if where.get("message") is not None:
            place = f"message {where['message']}, {where['field']}"
            if where.get("offset") is not None:
                # Counted from 1, as messages are (the JSON's `offset` counts from 0).
                place += f", character {where['offset'] + 1}"
            lines.append(place)
        elif where.get("template_line") is not None:
            lines.append(f"template line {where['template_line']}, byte {where['render_offset']}")
        if where.get("before") or where.get("after"):
            lines.append(f"before: {where.get('before', '')}")
            lines.append(f"after:  {where.get('after', '')}")
        if pair["hint"]:
            lines += textwrap.wrap(pair["hint"], 72)
        out.write(f"{head:<9} {share:>6}  {pair['cause']:<18} {lines[0]}\n")
        for line in lines[1:]:
            out.write(f"{'':<9} {'':>6}  {'':<18} {line}\n")


def main(argv: Sequence[str], out: IO[str]) -> int:
    args = parser().parse_args(argv)
    try:
        source, tokenizer_json = load_template(args.template, args.tokenizer)
        requests = read_requests(args.requests)
    except (UsageError, RequestError) as exc:
        sys.stderr.write(f"python -m checks diagnose: error: {exc}\n")
        return 2
    pool = SandboxPool(limits=SandboxLimits(cpu_seconds=args.cpu_seconds))
    try:
        pairs = diagnose_requests(source, requests, pool=pool, tokenizer_json=tokenizer_json)
    except SandboxError as exc:
        sys.stderr.write(f"python -m checks diagnose: the template failed: {exc}\n")
        return 2
    finally:
        pool.close()
    if args.json:
        json.dump({"pairs": pairs}, out, indent=2, ensure_ascii=False)
        out.write("\n")
    else:
        print_pairs(pairs, out)
    return 0
