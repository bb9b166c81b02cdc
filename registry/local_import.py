"""Import repos from a local folder laid out as on the Hub, for air-gapped use.

`DIR/owner/name/` (or `DIR/owner--name/`, or `DIR/models--owner--name/` as in the Hub cache's
naming) holds a repo's files: tokenizer_config.json, chat_template.jinja, config.json, ….
A folder's "commit" is a hash of the files' contents, so importing again changes nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ValidationError

from .hub import CommitInfo, FileInfo
from .models import HubModel, validate_repo_id
from .repo_files import (
    CONFIG_JSON,
    TEMPLATE_DIR,
    TEMPLATE_FILES,
    TOKENIZER_JSON,
    BrokenRepo,
    architecture_facts,
    find_templates,
)
from .sync import CommitTemplates, Observation, SyncResult, record, size_cap

MARKERS = (*TEMPLATE_FILES, CONFIG_JSON, TEMPLATE_DIR)


@dataclass(frozen=True)
class LocalRepo:
    repo_id: str
    path: Path


def _repo_id(root: Path, folder: Path) -> str:
    parts = folder.relative_to(root).parts
    if len(parts) == 1:
        name = parts[0].removeprefix("models--")
        return name.replace("--", "/", 1) if "--" in name else f"local/{name}"
    return "/".join(parts[-2:])


def discover(root: Path) -> tuple[list[LocalRepo], list[str]]:
    """Repo folders below `root` (two levels at most), and one-line problems found."""
    repos, problems = [], []
    candidates = [root] + sorted(p for p in root.glob("*") if p.is_dir())
    candidates += sorted(p for p in root.glob("*/*") if p.is_dir() and p.name != TEMPLATE_DIR)
    for folder in candidates:
        if folder == root or not any((folder / m).exists() for m in MARKERS):
            continue
        try:
            repos.append(LocalRepo(validate_repo_id(_repo_id(root, folder)), folder))
        except ValidationError as err:
            problems.append(f"{folder}: {err.messages[0]}")
    return repos, problems


def _read(path: Path, name: str) -> bytes:
    cap = size_cap(name)
    if path.stat().st_size > cap:
        raise BrokenRepo(f"{name} is {path.stat().st_size:,} bytes, over the {cap:,}-byte cap")
    return path.read_bytes()


def observe_folder(folder: Path) -> Observation:
    files: dict[str, bytes] = {}
    broken = ""
    try:
        for name in TEMPLATE_FILES:
            if (folder / name).is_file():
                files[name] = _read(folder / name, name)
        extra = folder / TEMPLATE_DIR
        if extra.is_dir():
            for path in sorted(extra.glob("*.jinja")):
                files[f"{TEMPLATE_DIR}/{path.name}"] = _read(path, path.name)
        found = find_templates(files)
    except BrokenRepo as err:
        broken, found = str(err), None
    config = folder / CONFIG_JSON
    try:
        facts = architecture_facts(_read(config, CONFIG_JSON) if config.is_file() else None, [])
    except BrokenRepo as err:
        broken, facts = broken or str(err), None
    digest = hashlib.sha1(b"cachesafe-local\0")
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    sha = digest.hexdigest()
    tokenizer = folder / TOKENIZER_JSON
    pointer = None
    if tokenizer.is_file():
        # Hash it in chunks: tokenizer.json can be tens of MB.
        h = hashlib.sha256()
        with tokenizer.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                h.update(chunk)
        pointer = FileInfo(TOKENIZER_JSON, tokenizer.stat().st_size, "", h.hexdigest())
    commit = CommitInfo(sha, None, f"imported from {folder.name}")
    states = [] if broken and found is None else [CommitTemplates(commit, found, pointer)]
    return Observation(
        head_sha=sha,
        head_date=None,
        states=states,
        files_signature={"commit": sha, "paths": {}},
        incremental=True,
        history_complete=True,
        broken_reason=broken,
        facts=facts,
        via_local=True,
    )


def import_local(root: Path) -> tuple[list[SyncResult], list[str]]:
    """Import every repo folder below `root`; return the results and the problems."""
    repos, problems = discover(root)
    results = []
    for repo in repos:
        model, _ = HubModel.objects.track(repo.repo_id, via="local")
        results.append(record(model.pk, observe_folder(repo.path)))
    return results, problems
