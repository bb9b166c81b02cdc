"""`python -m checks PATH... [--tokenizer FILE] [--json]`: check templates from the command line.

PATH is a `.jinja` file, a `tokenizer_config.json` (or `chat_template.json`), a model repository
directory (template precedence as in transformers, its tokenizer.json used when present), or a
directory holding such files at any depth.

Exit status: 0, or 1 when a template's verdict is one that `--fail-on` names (a CI gate on a
model upgrade: `--fail-on unsafe` fails on "Breaks the cache", `--fail-on error` on "Does not
render"; both may be given), with a one-line hint per failing template on stderr; 2 on usage
errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from checks import (
    ENGINE_VERSION,
    CheckInput,
    CheckOptions,
    DirectoryResultCache,
    MemoryResultCache,
    ResultCache,
    SandboxLimits,
    SandboxPool,
    TemplateReport,
    as_input,
    check_templates,
)
from checks.clients import PROFILE_NAMES, TYPICAL
from checks.reports import (
    ASSISTANT_OUTPUT,
    ERROR,
    GENERATION_PROMPT,
    HISTORY,
    SAFE,
    SAFE_WHERE_RENDERABLE,
    TOKEN_SEAM,
    UNSAFE,
    VERDICT_LABELS,
)
from checks.reuse import BLOCK, CACHE_CLASSES, HYBRID, HYBRID_CHECKPOINTS, TRIMMABLE
from checks.sandbox import DEFAULT_CPU_SECONDS, cpu_budget
from checks.setups import (
    SETUP_PARTS,
    THINKING_CHOICES,
    THINKING_DEFAULT,
    Setup,
    is_chosen,
    reply_fate,
    setup_value,
    setup_verdict,
)
from checks.sources import TEMPLATE_DIR, SourceError, decode_text, load_repository

_REPOSITORY_FILES = ("chat_template.jinja", "tokenizer_config.json", "chat_template.json")


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m checks",
        description="Does a chat template keep a prompt cache warm across an agent's turns? "
        "(Also: `python -m checks diagnose --help` for a client's own requests, and "
        "`python -m checks proxy --help` for a recording proxy.)",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", type=Path)
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json for token-level checks")
    parser.add_argument("--json", action="store_true", help="print {'results': [...]} as JSON")
    parser.add_argument("--cache-dir", type=Path, help="keep results here across runs")
    parser.add_argument(
        "--cpu-seconds",
        "--timeout",
        dest="cpu_seconds",
        type=cpu_budget,
        default=DEFAULT_CPU_SECONDS,
        help="CPU seconds one template check may use (the service's default too)",
    )
    parser.add_argument(
        "--fail-on",
        action="append",
        choices=[UNSAFE, ERROR],
        default=[],
        help="exit 1 when a template breaks the cache (unsafe) or does not render (error)",
    )
    setup = parser.add_argument_group(
        "your setup", "judge (and gate with --fail-on) for your client, engine and setting"
    )
    # No defaults here: an option given, even with the typical value, chooses a setup (as
    # ?thinking=default does on the site); one left out takes the typical value. Each value is
    # read as the site reads it (`setup_value`: stripped, then one of the choices exactly).
    setup.add_argument(
        "--client", type=setup_value, choices=PROFILE_NAMES, help=f"default: {TYPICAL.name}"
    )
    setup.add_argument(
        "--engine", type=setup_value, choices=CACHE_CLASSES, help=f"default: {TRIMMABLE}"
    )
    setup.add_argument(
        "--thinking",
        type=setup_value,
        choices=THINKING_CHOICES,
        help=f"default: {THINKING_DEFAULT}",
    )
    parser.add_argument("--version", action="version", version=f"checks {ENGINE_VERSION}")
    return parser


def _read_tokenizer(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return decode_text(path.read_bytes(), path.name)
    except (OSError, SourceError) as exc:
        raise UsageError(f"cannot read tokenizer {path}: {exc}") from exc


def _is_repository(directory: Path) -> bool:
    """A model repository's folder, as `load_repository` reads one: a template file, or named
    templates alone (`additional_chat_templates/*.jinja`, each checked by its name)."""
    return any((directory / name).is_file() for name in _REPOSITORY_FILES) or any(
        (directory / TEMPLATE_DIR).glob("*.jinja")
    )


def _is_template_file(path: Path) -> bool:
    # Other JSON files (indexes, results) are not templates: only configs by their usual names.
    return path.suffix == ".jinja" or (
        path.suffix == ".json" and ("tokenizer_config" in path.name or "chat_template" in path.name)
    )


def template_files(directory: Path, _walked: list[Path] | None = None) -> list[Path]:
    """Templates and configs anywhere below a directory, hidden folders skipped, in path order.
    A linked folder is followed once (`models/llama -> /data/llama`), unless it leads back
    into a folder already walked (a link loop)."""
    walked = _walked if _walked is not None else [directory.resolve()]
    found: list[Path] = []
    try:
        for p in directory.rglob("*"):
            if any(part.startswith(".") for part in p.relative_to(directory).parts):
                continue
            if p.is_symlink() and p.is_dir():
                target = p.resolve()
                if not any(target.is_relative_to(w) or w.is_relative_to(target) for w in walked):
                    walked.append(target)
                    found += template_files(p, walked)
            elif p.is_file() and _is_template_file(p):
                found.append(p)
    except RecursionError:  # pathlib walks folders by recursion: about a thousand deep
        raise UsageError(f"{directory}: folders nested too deeply to walk") from None
    return sorted(found)


def _repository_input(path: Path, tokenizer_json: str | None) -> CheckInput:
    """A model repository folder, checked as transformers reads it, with its own tokenizer.json
    unless one was given. Its own tokenizer that cannot be read costs the token-level checks
    (the summary says why), not the run, as an unparsable one does in the sandbox."""
    tokenizer, note = tokenizer_json, ""
    if tokenizer is None and (path / "tokenizer.json").is_file():
        try:
            tokenizer = decode_text((path / "tokenizer.json").read_bytes(), "tokenizer.json")
        except (OSError, SourceError) as exc:
            note = f"the tokenizer.json could not be read ({exc})"
    try:
        return CheckInput(load_repository(path), str(path), tokenizer, tokenizer_note=note)
    except (SourceError, OSError) as exc:
        return CheckInput(None, str(path), tokenizer, str(exc))


def _directory_inputs(directory: Path, tokenizer_json: str | None) -> list[CheckInput]:
    """Templates below a folder: a folder below it that is a model repository is checked as
    one (transformers' precedence, its tokenizer.json), as it is when given itself."""
    repositories: set[Path] = set()
    loose: list[Path] = []
    for file in template_files(directory):
        below = file.relative_to(directory).parts[:-1]
        folders = [directory.joinpath(*below[: n + 1]) for n in range(len(below))]
        repository = next((f for f in folders if _is_repository(f)), None)
        if repository is None:
            loose.append(file)
        else:
            repositories.add(repository)
    found = []
    for path in repositories:
        item = _repository_input(path, tokenizer_json)
        if item.source is not None:  # named by the file that won, as a file of the folder is
            item = replace(item, file=str(path / item.source.origin))
        found.append((path, item))
    found += [(p, _file_input(p, tokenizer_json)) for p in loose]
    return [item for _, item in sorted(found, key=lambda pair: pair[0].parts)]


def collect_inputs(paths: Sequence[Path], tokenizer_json: str | None) -> list[CheckInput]:
    """Turn command-line paths into check inputs; a missing path is a usage error."""
    items: list[CheckInput] = []
    for path in paths:
        if path.is_dir():
            if _is_repository(path):
                items.append(_repository_input(path, tokenizer_json))
                continue
            items += _directory_inputs(path, tokenizer_json)
        elif path.is_file():
            items.append(_file_input(path, tokenizer_json))
        else:
            raise UsageError(f"no such file or directory: {path}")
    if not items:
        # A CI gate over a folder that holds no template must not pass as if all were safe.
        raise UsageError(
            f"no chat template found in {', '.join(map(str, paths))} (looked for .jinja files, "
            "tokenizer_config.json, chat_template.json and repository folders)"
        )
    return items


def _file_input(path: Path, tokenizer_json: str | None) -> CheckInput:
    item = as_input(path, str(path), tokenizer_json)
    return CheckInput(item.source, str(path), tokenizer_json, item.source_error, item.source_sha256)


#: What to do about the first breaking cause of a template, in one line.
CAUSE_HINTS = {
    HISTORY: "earlier messages render differently once a turn is added (template line {lines}):"
    " render history the same way every turn, or pick a model whose template does",
    GENERATION_PROMPT: "the generation prompt differs from how the same assistant turn renders as"
    " history (template line {lines}): pass the setting the summary names, or fix that line",
    ASSISTANT_OUTPUT: "the reply is written back differently from how the model emitted it"
    " (template line {lines}): send the reply back as generated",
    TOKEN_SEAM: "byte prefixes hold but the tokens merge across the seam (template line {lines}):"
    " end each turn on a token boundary",
}


def labelled(label: str, sentence: str) -> str:
    """`label: sentence`, unless the sentence already begins with the label's words
    ("Breaks the cache for a client that…")."""
    if sentence.lower().startswith(label.lower()):
        return sentence
    return f"{label}: {sentence}"


def fix_hint(report: TemplateReport) -> str:
    """One line saying what to do about a template that fails the gate."""
    if report.verdict == ERROR:
        return report.reason or report.summary
    failure = next((f for f in report.failures if f.status == "fail"), None)
    if failure is None:
        return report.summary
    lines = ", ".join(map(str, failure.template_lines)) or "?"
    hint = CAUSE_HINTS.get(failure.cause, "{lines}").format(lines=lines)
    return f"{failure.variant}, {failure.session}: {hint}"


_ENGINE_COLUMNS = (
    (TRIMMABLE, "trimmable"),
    (BLOCK, "block"),
    (HYBRID, "hybrid"),
    (HYBRID_CHECKPOINTS, "hybrid+ckpt"),
)
_SHORT = {SAFE: "safe", UNSAFE: "breaks", SAFE_WHERE_RENDERABLE: "safe*", ERROR: "error"}


def setup_rows(report: TemplateReport) -> list[str]:
    """The headline setting's verdict per client profile (rows) and engine cache class
    (columns), with prompt and reply reuse told apart."""
    variant = next((v for v in report.variants if v.clients), None)
    if variant is None or report.verdict == ERROR:
        return []
    head = "".join(f"{name:<13}" for _, name in _ENGINE_COLUMNS)
    title = f"client ({variant.label})"
    rows = [f"{title:<28}{head}reply"]
    for client in variant.clients:
        if client.verdict is None:
            rows.append(f"  {client.profile:<26}does not apply: {client.note}")
            continue
        cells = "".join(
            f"{_SHORT.get(client.engines.get(key, ''), '-'):<13}" for key, _ in _ENGINE_COLUMNS
        )
        rows.append(f"  {client.profile:<26}{cells}{reply_fate(client) or '-'}")
    return rows


def display_names(files: Sequence[str]) -> list[str]:
    """Each file by its name, or, when two share one (a folder of repositories, each with its
    `tokenizer_config.json`), by its path below the folder they share."""
    names = [Path(f).name for f in files]
    if len(set(names)) == len(names):
        return names
    paths = [Path(f) for f in files]
    try:
        common = Path(os.path.commonpath([p.parent for p in paths]))
    except ValueError:  # relative and absolute paths mixed: no folder is common to both
        return [str(p) for p in paths]
    return [str(p.relative_to(common)) if p.is_relative_to(common) else str(p) for p in paths]


def print_table(reports: Sequence[TemplateReport], out: IO[str]) -> None:
    names = display_names([r.file for r in reports])
    width = max([len(name) for name in names] + [8])
    out.write(f"{'TEMPLATE':<{width}}  {'VERDICT':<21}  SUMMARY\n")
    for report, name in zip(reports, names, strict=True):
        summary = textwrap.wrap(report.summary, 80) or [""]
        label = VERDICT_LABELS.get(report.verdict, report.verdict)
        out.write(f"{name:<{width}}  {label:<21}  {summary[0]}\n")
        for line in summary[1:]:
            out.write(f"{'':<{width}}  {'':<21}  {line}\n")
        for failure in [f for f in report.failures if f.status == "fail"][:3]:
            lines = ", ".join(map(str, failure.template_lines)) or "?"
            many = "s" if len(failure.template_lines) > 1 else ""
            out.write(
                f"{'':<{width}}  {'':<21}  - {failure.variant} / {failure.session} "
                f"request {failure.request_index}: {failure.cause} at byte {failure.byte_offset} "
                f"({failure.segment}, template line{many} {lines})\n"
            )
        for row in setup_rows(report):
            out.write(f"{'':<{width}}  {'':<21}  {row}\n")


def _gate_on_setup(
    reports: Sequence[TemplateReport], setup: Setup, fail_on: set[str], out: IO[str], *, quiet: bool
) -> int:
    """With --client/--engine/--thinking: the verdict for that setup decides the exit code."""
    failed = False
    for report in reports:
        chosen = setup_verdict(report, setup)
        verdict = report.verdict if chosen is None else chosen.verdict
        sentence = chosen.sentence if chosen is not None else fix_hint(report)
        if verdict is not None and verdict in fail_on:
            sys.stderr.write(f"{report.file}: {labelled(VERDICT_LABELS[verdict], sentence)}\n")
            failed = True
        elif not quiet:
            out.write(f"{Path(report.file).name}: for your setup: {sentence}\n")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        tokenizer_json = _read_tokenizer(args.tokenizer)
        items = collect_inputs(args.paths, tokenizer_json)
        if args.cache_dir and args.cache_dir.exists() and not args.cache_dir.is_dir():
            raise UsageError(f"--cache-dir {args.cache_dir}: not a directory")
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"python -m checks: error: {exc}\n")
        return 2
    cache: ResultCache = (
        DirectoryResultCache(args.cache_dir) if args.cache_dir else MemoryResultCache()
    )
    # Indented for a terminal; one line for a pipe or a file. `json.dump` and indenting both take
    # the pure-Python encoder, which cost more than the checks (1.5 s for the corpus). One line
    # is written report by report as each is ready, while the other checks run.
    lines = args.json and not out.isatty()
    written: list[str] = [""] * len(items)
    options = {part: getattr(args, part) for part in SETUP_PARTS}
    setup, setup_chosen = Setup.parse(options), is_chosen(options)

    def as_json(report: TemplateReport) -> dict[str, Any]:
        """The report, and with --client/--engine/--thinking the verdict for that setup (the
        API's `setup`; null when the report has none to give, an error)."""
        found = report.to_dict()
        if setup_chosen:
            chosen = setup_verdict(report, setup)
            found["setup"] = None if chosen is None else chosen.to_dict()
        return found

    def write(index: int, report: TemplateReport) -> None:
        written[index] = json.dumps(as_json(report), ensure_ascii=False)

    pool = SandboxPool(limits=SandboxLimits(cpu_seconds=args.cpu_seconds))
    try:
        reports = check_templates(
            items,
            options=CheckOptions(),
            pool=pool,
            cache=cache,
            on_report=write if lines else None,
        )
    finally:
        pool.close()
    if lines:
        # What json.dumps({"results": [...]}) writes, assembled from the reports' own JSON.
        out.write('{"results": [' + ", ".join(written) + "]}\n")
    elif args.json:
        results = {"results": [as_json(r) for r in reports]}
        out.write(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    else:
        print_table(reports, out)
    if setup_chosen:
        return _gate_on_setup(reports, setup, set(args.fail_on), out, quiet=args.json)
    failing = [r for r in reports if r.verdict in set(args.fail_on)]
    for report in failing:
        label = VERDICT_LABELS[report.verdict]
        sys.stderr.write(f"{report.file}: {labelled(label, fix_hint(report))}\n")
    return 1 if failing else 0
