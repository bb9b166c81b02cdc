"""Sync tracked repos with the Hub: observe over the network, then record in one transaction.

Observing reads nothing from the database it will write and writes nothing; recording is one
transaction for a repo, or for a batch of repos read together, so a sync interrupted anywhere
leaves either all of its rows or none.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import close_old_connections, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Max, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from .derivatives import record_stale_fixes_after_syncs, refresh_drift_many
from .gguf_files import gguf_facts, gguf_paths, read_embedded
from .hub import (
    REVISION_GONE,
    CommitInfo,
    FileInfo,
    HubClient,
    HubUnavailable,
    RepoInfo,
    RepoUnavailable,
)
from .models import (
    HubModel,
    ModelFormat,
    ModelStatus,
    NamedTemplate,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
)
from .models.catalog import DATED
from .repo_files import (
    CHAT_TEMPLATE_JINJA,
    CONFIG_JSON,
    TEMPLATE_DIR,
    TEMPLATE_FILES,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    WATCHED_PATHS,
    ArchitectureFacts,
    BrokenRepo,
    FoundTemplates,
    architecture_facts,
    config_facts,
    find_templates,
    sha256_text,
)
from .signals import catalog_changed, status_changed, template_changed
from .verdicts import record_unreadable

logger = logging.getLogger(__name__)

#: Statuses that mean the repo at `template_files["commit"]` was read completely.
SETTLED = frozenset({ModelStatus.OK, ModelStatus.NO_TEMPLATE, ModelStatus.BROKEN})
WATCHED = frozenset(WATCHED_PATHS)
Identity = tuple[str, tuple[tuple[str, str], ...]] | None


def size_cap(path: str) -> int:
    """Templates are a few KB; tokenizer_config.json can carry a large added-tokens table."""
    if path.endswith(".jinja"):
        return int(settings.REGISTRY_MAX_TEMPLATE_BYTES)
    return int(settings.REGISTRY_MAX_JSON_BYTES)


@dataclass(frozen=True)
class CommitTemplates:
    """The templates at a commit where a watched file changed (found=None: no template)."""

    commit: CommitInfo
    found: FoundTemplates | None
    tokenizer_json: FileInfo | None = None


@dataclass
class Observation:
    """Everything one sync learned about a repo, ready to record."""

    head_sha: str
    head_date: datetime | None
    states: list[CommitTemplates]  # oldest first
    files_signature: dict[str, Any]
    incremental: bool
    history_complete: bool | None
    broken_reason: str = ""
    facts: ArchitectureFacts | None = None
    info: RepoInfo | None = None
    via_local: bool = False
    #: A GGUF repo: each file's entry (HubModel.gguf_files), the templates they embed by
    #: SHA-256, and model fields from the GGUF architecture.
    gguf_files: list[dict[str, Any]] | None = None
    gguf_texts: dict[str, str] = field(default_factory=dict)
    gguf_facts: dict[str, Any] = field(default_factory=dict)
    #: A first sync that read the head alone: the history before it waits for the backfill.
    history_from: str = ""


@dataclass
class SyncResult:
    repo_id: str
    outcome: str  # "unchanged", "updated", "unavailable", "failed"
    status: str
    changes: int = 0
    message: str = ""
    #: For a failed sync the Hub rate-limited: the seconds it asked us to wait.
    retry_after: float | None = None

    def line(self) -> str:
        text = f"{self.repo_id}: {self.status}"
        if self.outcome == "unchanged":
            text += " (unchanged)"
        if self.changes:
            text += f", {self.changes} template change(s) recorded"
        if self.message:
            text += f": {self.message}"
        return text


@dataclass
class _Walk:
    """State of a walk over commits, oldest to newest."""

    signature: dict[str, str] | None
    broken: str
    states: list[CommitTemplates] = field(default_factory=list)
    #: Templates already read, by the signature of their files: a commit whose files have the
    #: same ids holds the same templates, so they are not downloaded again.
    known: dict[str, FoundTemplates] = field(default_factory=dict)


def model_format(info: RepoInfo) -> str:
    """GGUF when the repo holds GGUF files, MLX when it says it is for mlx, else safetensors
    when it holds safetensors weights; empty otherwise."""
    names = [p.rsplit("/", 1)[-1].lower() for p in info.files]
    if info.gguf or any(n.endswith(".gguf") for n in names):
        return ModelFormat.GGUF
    if info.library_name.lower() == "mlx" or "mlx" in info.tags:
        return ModelFormat.MLX
    if info.library_name == "transformers" or any(n.endswith(".safetensors") for n in names):
        return ModelFormat.SAFETENSORS
    return ""


def metadata_fields(info: RepoInfo) -> dict[str, Any]:
    return {
        "format": model_format(info),
        "author": info.author,
        "downloads": info.downloads,
        "likes": info.likes,
        "tags": info.tags,
        "pipeline_tag": info.pipeline_tag,
        "library_name": info.library_name,
        "base_model": info.base_model,
        "last_commit_sha": info.sha,
        "last_commit_at": info.last_modified,
    }


def facts_fields(facts: ArchitectureFacts) -> dict[str, Any]:
    return {
        "model_type": facts.model_type,
        "architectures": list(facts.architectures),
        "is_hybrid": facts.is_hybrid,
        "has_sliding_window": facts.has_sliding_window,
        "quantization": facts.quantization,
    }


def _assign(model: HubModel, values: dict[str, Any]) -> list[str]:
    """Set the fields that differ; return their names (nothing to save when empty)."""
    changed = []
    for name, value in values.items():
        if getattr(model, name) != value:
            setattr(model, name, value)
            changed.append(name)
    return changed


def head_entries(info: RepoInfo) -> dict[str, FileInfo] | None:
    """The head's top-level files from model info (its `siblings` carry the same ids a tree
    listing does), which saves listing the head's tree; None when model info cannot stand in:
    ids missing (a Hub without file metadata), or an additional_chat_templates/ folder, whose
    tree id only a listing gives."""
    files = info.files
    if not files or any(p.startswith(TEMPLATE_DIR + "/") for p in files):
        return None
    watched = [e for path, e in files.items() if path in WATCHED]
    if any(not e.content_id for e in watched):
        return None
    return {path: e for path, e in files.items() if "/" not in path}


class RegistrySync:
    """Sync HubModels with the Hub through one HubClient."""

    def __init__(self, client: HubClient | None = None, limit: int | None = None) -> None:
        self.client = client or HubClient()
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit or int(settings.REGISTRY_HISTORY_LIMIT)

    # --- entry point -----------------------------------------------------------------------

    def sync(self, model: HubModel, *, force: bool = False) -> SyncResult:
        """Bring one model up to date; raises HubUnavailable when the Hub should be retried."""
        found = self.look(model, force=force)
        return record(model.pk, found) if isinstance(found, Observation) else found

    def look(self, model: HubModel, *, force: bool = False) -> Observation | SyncResult:
        """Read what changed upstream: an Observation to record, or the result of a sync that
        has no templates to record (gone, gated, unchanged), written at once (a statement or
        two). Raises HubUnavailable when the Hub should be retried."""
        try:
            info = self.client.model_info(model.repo_id)
        except RepoUnavailable as gone:
            return record_unavailable(model.pk, gone.status, gone.reason, None)
        except HubUnavailable as err:
            if err.status in NOT_FOUND and not err.code:
                if (missing := record_not_found(model, err.status, str(err))) is not None:
                    return missing
            else:
                record_failure(model.pk, str(err))
            raise
        if info.disabled:
            return record_unavailable(model.pk, ModelStatus.DISABLED, "disabled on the Hub", info)
        if not info.sha:
            info = self._with_head(info)
        known = model.template_files.get("commit") if model.template_files else None
        if not force and known == info.sha and model.status in SETTLED:
            return record_unchanged(model.pk, info)
        try:
            if not known and not force and not gguf_paths(info.files):
                # A new repo: its head now (template, verdict), its history later.
                observation = self.observe_head(model, info)
            else:
                observation = self.observe(model, info, incremental=bool(known) and not force)
        except RepoUnavailable as gone:
            if info.gated and gone.status == ModelStatus.PRIVATE:
                # A Hub that refuses a gated repo's files without saying "GatedRepo".
                return record_unavailable(model.pk, ModelStatus.GATED, "gated", info)
            return record_unavailable(model.pk, gone.status, gone.reason, info)
        except HubUnavailable as err:
            record_failure(model.pk, str(err), found=True)
            raise
        return observation

    def _with_head(self, info: RepoInfo) -> RepoInfo:
        """The head commit from the commit list, for a Hub whose model info has no `sha`."""
        try:
            head = next(iter(self.client.iter_commits(info.repo_id, "main")))
        except StopIteration:
            raise HubUnavailable(f"{info.repo_id}: the Hub lists no commits") from None
        return replace(info, sha=head.sha, last_modified=info.last_modified or head.date)

    # --- observing -------------------------------------------------------------------------

    def observe(self, model: HubModel, info: RepoInfo, *, incremental: bool) -> Observation:
        if gguf_paths(info.files):
            return self._observe_gguf(model, info)
        repo_id = info.repo_id if info.repo_id == model.repo_id else model.repo_id
        known = model.template_files.get("commit") if incremental else None
        window: list[CommitInfo] = []  # newest first
        reached_known = False
        complete = True
        for commit in self.client.iter_commits(repo_id, info.sha):
            if known and commit.sha == known:
                reached_known = True
                break
            window.append(commit)
            if len(window) >= self.limit:
                complete = False
                break
        if not window and not reached_known:
            window = [CommitInfo(info.sha, info.last_modified, "")]
        walk = _Walk(
            signature=model.template_files.get("paths") if reached_known else None,
            broken=model.status_reason
            if reached_known and model.status == ModelStatus.BROKEN
            else "",
        )
        blobs: dict[str, bytes] = {}
        for commit in reversed(window):
            listed = head_entries(info) if commit.sha == info.sha else None
            self._observe_commit(repo_id, commit, walk, blobs, listed)
        architecture = self._architecture(repo_id, info, blobs)
        broken = walk.broken
        facts = architecture if isinstance(architecture, ArchitectureFacts) else None
        if isinstance(architecture, str):
            broken = broken or architecture
        return Observation(
            head_sha=info.sha,
            head_date=info.last_modified,
            states=walk.states,
            files_signature={"commit": info.sha, "paths": walk.signature or {}},
            # Compared with the current templates whenever a sync read some, also when the
            # commit it read is not reached (more new commits than the window, or a history
            # squashed or force-pushed since): else an unchanged template is a new "added".
            incremental=bool(known),
            history_complete=None if reached_known else complete,
            broken_reason=broken,
            facts=facts,
            info=info,
            gguf_files=no_gguf_files(model),
        )

    def observe_head(self, model: HubModel, info: RepoInfo) -> Observation:
        """The head alone: its files from model info, its template files, and facts from the
        Hub's config summary (config.json itself waits for the backfill unless nothing else
        was downloaded: a download is what proves a gated repo lets us read it). Two or three
        requests with model info, against one per commit and file for the whole history."""
        repo_id = model.repo_id
        listed = head_entries(info)
        if listed is None:
            listed = {e.path: e for e in self.client.list_folder(repo_id, info.sha)}
        walk = _Walk(signature=None, broken="")
        blobs: dict[str, bytes] = {}
        head = CommitInfo(info.sha, info.last_modified, "")
        self._observe_commit(repo_id, head, walk, blobs, listed)
        facts: ArchitectureFacts | str
        if blobs or walk.broken:
            facts = config_facts(info.config, info.tags)
        else:
            facts = self._architecture(repo_id, info, blobs)
        broken = walk.broken or (facts if isinstance(facts, str) else "")
        signature: dict[str, Any] = {"commit": info.sha, "paths": walk.signature or {}}
        config = info.files.get(CONFIG_JSON)
        if config is not None and listed.get(CONFIG_JSON) is not None:
            # For the backfill, which reads config.json at this head without listing it.
            signature["config"] = {"id": config.content_id, "size": config.size}
        return Observation(
            head_sha=info.sha,
            head_date=info.last_modified,
            states=walk.states,
            files_signature=signature,
            incremental=False,
            history_complete=False,
            broken_reason=broken,
            facts=facts if isinstance(facts, ArchitectureFacts) else None,
            info=info,
            history_from=info.sha,
            gguf_files=no_gguf_files(model),
        )

    def backfill(self, model: HubModel) -> SyncResult:
        """Read the history before the head a first sync read alone (`history_from`), and
        config.json at that head; record the changes found as backfilled (not announced)."""
        start = model.history_from
        if not start:
            return SyncResult(model.repo_id, "unchanged", model.status)
        window: list[CommitInfo] = []  # newest first; window[0] is `start`
        complete = True
        try:
            for commit in self.client.iter_commits(model.repo_id, start):
                window.append(commit)
                if len(window) >= self.limit:  # the head counts, as in a full walk
                    complete = False
                    break
            walk = _Walk(signature=None, broken="", known=_head_templates(model, start))
            blobs: dict[str, bytes] = {}
            for commit in reversed(window[1:]):
                self._observe_commit(model.repo_id, commit, walk, blobs)
            config = self._config_at(model, start)
        except RepoUnavailable as gone:
            return record_unavailable(model.pk, gone.status, gone.reason, None)
        except HubUnavailable as err:
            if err.code == REVISION_GONE and not window:
                # The head the first sync read is gone (a history squashed or force-pushed
                # since): there is no history before it to read, and asking again would fail
                # at every run, ahead of the repos queued after it.
                return record_history(model.pk, start, "", [], False, None)
            record_failure(model.pk, str(err))
            raise
        title = window[0].title if window else ""
        return record_history(model.pk, start, title, walk.states, complete, config)

    def _config_at(self, model: HubModel, revision: str) -> ArchitectureFacts | None:
        """Facts from config.json at `revision`: where the first sync saw it, one download."""
        files = model.template_files if isinstance(model.template_files, dict) else {}
        seen = files.get("config") if files.get("commit") == revision else None
        if isinstance(seen, dict):
            size = seen.get("size")
            entry: FileInfo | None = FileInfo(
                CONFIG_JSON, size if isinstance(size, int) else None, str(seen.get("id") or "")
            )
        elif files.get("commit") == revision and "paths" in files:
            entry = None  # the first sync saw the head's files: no config.json there
        else:
            listed = self.client.list_folder(model.repo_id, revision)
            entry = next((e for e in listed if e.path == CONFIG_JSON), None)
        if entry is None:
            return None
        try:
            data = self._fetch(model.repo_id, revision, entry, {})
            return architecture_facts(data, [])
        except BrokenRepo:
            return None

    def _observe_gguf(self, model: HubModel, info: RepoInfo) -> Observation:
        """A GGUF repo: the templates its files embed at the head (what llama.cpp uses), not
        the history of its tokenizer files; a later sync records the changes it sees."""
        previous = model.gguf_files if isinstance(model.gguf_files, list) else []
        if info.repo_id != model.repo_id:
            info = replace(info, repo_id=model.repo_id)
        embedded = read_embedded(self.client, info, previous)
        has_current = model.current_snapshot_id is not None
        broken = embedded.broken
        if embedded.unchanged and model.status == ModelStatus.BROKEN:
            # No file changed, so none was read again: the reason it was broken still holds
            # (lost, the repo came back `ok` with a template its files no longer carry).
            broken = model.status_reason or "the GGUF files cannot be read"
        states = []
        if not (embedded.unchanged and has_current):
            commit = CommitInfo(info.sha, info.last_modified, "")
            states.append(CommitTemplates(commit, embedded.found))
        paths = {e["path"]: e["id"] for e in embedded.files}
        return Observation(
            head_sha=info.sha,
            head_date=info.last_modified,
            states=[] if broken else states,
            files_signature={"commit": info.sha, "paths": paths},
            incremental=has_current,
            history_complete=None,
            broken_reason=broken,
            info=info,
            gguf_files=embedded.files,
            gguf_texts=embedded.texts,
            gguf_facts=gguf_facts(embedded.architecture) if embedded.architecture else {},
        )

    def _observe_commit(
        self,
        repo_id: str,
        commit: CommitInfo,
        walk: _Walk,
        blobs: dict[str, bytes],
        listed: dict[str, FileInfo] | None = None,
    ) -> None:
        if listed is None:
            listed = {e.path: e for e in self.client.list_folder(repo_id, commit.sha)}
        entries = {path: e for path, e in listed.items() if path in WATCHED}
        signature = {path: entry.content_id for path, entry in sorted(entries.items())}
        if signature == walk.signature:
            return
        walk.signature = signature
        key = json.dumps(signature, sort_keys=True)
        if key in walk.known and signature:
            walk.broken = ""
            walk.states.append(
                CommitTemplates(commit, walk.known[key], entries.get(TOKENIZER_JSON))
            )
            return
        try:
            files = self._template_files(repo_id, commit.sha, entries, blobs)
            found = find_templates(files)
        except BrokenRepo as err:
            # Only the head's state decides the status; an older broken commit is skipped.
            walk.broken = str(err)
            return
        walk.broken = ""
        walk.states.append(CommitTemplates(commit, found, entries.get(TOKENIZER_JSON)))

    def _fetch(
        self, repo_id: str, revision: str, entry: FileInfo, blobs: dict[str, bytes]
    ) -> bytes:
        cap = size_cap(entry.path)
        if entry.size is not None and entry.size > cap:
            raise BrokenRepo(f"{entry.path} is {entry.size:,} bytes, over the {cap:,}-byte cap")
        key = f"{entry.path}\0{entry.content_id}"
        if key not in blobs or not entry.content_id:
            blobs[key] = self.client.download(repo_id, revision, entry.path, cap)
        return blobs[key]

    def _template_files(
        self, repo_id: str, revision: str, entries: dict[str, FileInfo], blobs: dict[str, bytes]
    ) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        wanted = [entries[p] for p in TEMPLATE_FILES if p in entries and not entries[p].is_folder]
        # chat_template.jinja wins over tokenizer_config.json's template, but the tokens are
        # still read from tokenizer_config.json, so both are fetched.
        folder = entries.get(TEMPLATE_DIR)
        if folder is not None and folder.is_folder:
            listed = self.client.list_folder(repo_id, revision, TEMPLATE_DIR)
            wanted += [e for e in listed if not e.is_folder and e.path.endswith(".jinja")]
        for entry in wanted:
            files[entry.path] = self._fetch(repo_id, revision, entry, blobs)
        return files

    def _architecture(
        self, repo_id: str, info: RepoInfo, blobs: dict[str, bytes]
    ) -> ArchitectureFacts | str:
        """Facts from config.json at the head (a broken-status reason when it is unusable).

        The download doubles as the access check: a gated repo answers model info but refuses
        files, which raises RepoUnavailable here even when no template file changed."""
        probe = info.files.get(CONFIG_JSON)
        for path in (CHAT_TEMPLATE_JINJA, TOKENIZER_CONFIG):
            if probe is None:
                probe = info.files.get(path)
        try:
            data = self._fetch(repo_id, info.sha, probe, blobs) if probe is not None else None
            config = data if probe is not None and probe.path == CONFIG_JSON else None
            return architecture_facts(config, info.tags)
        except BrokenRepo as err:
            return str(err)


# --- recording (one transaction per repo, or per batch of repos) ----------------------------


def _identity_of(snapshot: TemplateSnapshot | None) -> Identity:
    """What a change compares, of a stored snapshot (read with its named templates' versions:
    `prefetch_related("named_templates__version")`)."""
    if snapshot is None:
        return None
    named = tuple(sorted((n.name, n.version.sha256) for n in snapshot.named_templates.all()))
    return (snapshot.default_template.sha256, named)


def _identity(found: FoundTemplates | None) -> Identity:
    return found.identity() if found is not None else None


def _texts(found: FoundTemplates) -> list[str]:
    return [found.default, *found.named.values()]


def _load_versions(texts: Iterable[str], versions: dict[str, TemplateVersion]) -> None:
    """Put the TemplateVersion of each of `texts` in `versions` (by SHA-256): those already
    stored in one query, the new ones in one insert. A concurrent writer's insert of the same
    text waits for it (the unique SHA-256), and the read after it finds that row."""
    wanted = {sha256_text(text): text for text in texts}
    missing = [sha for sha in wanted if sha not in versions]
    if not missing:
        return
    versions |= {v.sha256: v for v in TemplateVersion.objects.filter(sha256__in=missing)}
    new = [sha for sha in missing if sha not in versions]
    if not new:
        return
    TemplateVersion.objects.bulk_create(
        [
            TemplateVersion(
                sha256=sha, text=wanted[sha], size=len(wanted[sha].encode("utf-8", "surrogatepass"))
            )
            for sha in new
        ],
        ignore_conflicts=True,
    )
    versions |= {v.sha256: v for v in TemplateVersion.objects.filter(sha256__in=new)}


def _snapshots(
    states: list[tuple[HubModel, CommitTemplates]], versions: dict[str, TemplateVersion]
) -> dict[tuple[int, str], TemplateSnapshot]:
    """The snapshot of each (model, state with templates), by (model id, commit): the stored
    ones in one query, the new ones (and their named templates) in one insert each.

    Every writer of a model's snapshots and changes holds the model's row lock
    (select_for_update), so a read then a create cannot race: no savepoint, no conflict."""
    if not states:
        return {}
    _load_versions(
        (text for _, s in states if s.found is not None for text in _texts(s.found)), versions
    )
    keys = {(model.pk, state.commit.sha) for model, state in states}
    stored = TemplateSnapshot.objects.select_related("default_template").filter(
        model_id__in={pk for pk, _ in keys}, commit_sha__in={sha for _, sha in keys}
    )
    found = {(s.model_id, s.commit_sha): s for s in stored if (s.model_id, s.commit_sha) in keys}
    new: dict[tuple[int, str], tuple[TemplateSnapshot, FoundTemplates]] = {}
    for model, state in states:
        key = (model.pk, state.commit.sha)
        templates, tokenizer = state.found, state.tokenizer_json
        if key in found or key in new or templates is None:
            continue
        snapshot = TemplateSnapshot(
            model=model,
            commit_sha=state.commit.sha,
            committed_at=state.commit.date,
            source_file=templates.source_file,
            default_template=versions[sha256_text(templates.default)],
            special_tokens=templates.special_tokens,
            tokenizer_json_sha=tokenizer.content_id if tokenizer else "",
            tokenizer_json_size=tokenizer.size if tokenizer else None,
        )
        new[key] = (snapshot, templates)
    TemplateSnapshot.objects.bulk_create([snapshot for snapshot, _ in new.values()])
    NamedTemplate.objects.bulk_create(
        NamedTemplate(snapshot=snapshot, name=name[:100], version=versions[sha256_text(text)])
        for snapshot, templates in new.values()
        for name, text in sorted(templates.named.items())
    )
    return found | {key: snapshot for key, (snapshot, _) in new.items()}


@dataclass
class _Changes:
    """Where a walk over recorded states ended, and the changes it created."""

    created: list[TemplateChange]
    identity: Identity
    version: TemplateVersion | None
    snapshot: TemplateSnapshot | None


#: A walk to record: the model, its states (oldest first) and the snapshot they follow.
_Walked = tuple[HubModel, list[CommitTemplates], TemplateSnapshot | None]


def _record_changes(
    walks: list[_Walked], versions: dict[str, TemplateVersion], *, backfilled: bool = False
) -> list[_Changes]:
    """For each walk: snapshots of its states and a TemplateChange wherever the templates
    differ from the state before (the first from the snapshot it follows). Set-wise: the
    snapshots, the changes already stored and the new ones each take one statement for every
    walk together."""
    snapshots = _snapshots(
        [(model, state) for model, states, _ in walks for state in states if state.found],
        versions,
    )
    walked_all: list[_Changes] = []
    planned: list[tuple[_Changes, TemplateChange]] = []
    for model, states, current in walks:
        walked = _Changes(
            [], _identity_of(current), current.default_template if current else None, current
        )
        for state in states:
            snapshot = snapshots[(model.pk, state.commit.sha)] if state.found else None
            walked.snapshot = snapshot
            new_identity = _identity(state.found)
            if new_identity == walked.identity:
                continue
            new_version = snapshot.default_template if snapshot is not None else None
            change = TemplateChange(
                model=model,
                commit_sha=state.commit.sha,
                committed_at=state.commit.date,
                title=state.commit.title,
                old_version=walked.version,
                new_version=new_version,
                snapshot=snapshot,
                backfilled=backfilled,
            )
            planned.append((walked, change))
            walked.identity, walked.version = new_identity, new_version
        walked_all.append(walked)
    if planned:
        # Under the models' row locks, as for the snapshots: a read then a create.
        stored = set(
            TemplateChange.objects.filter(
                model_id__in={c.model_id for _, c in planned},
                commit_sha__in={c.commit_sha for _, c in planned},
            ).values_list("model_id", "commit_sha")
        )
        new = [(w, c) for w, c in planned if (c.model_id, c.commit_sha) not in stored]
        TemplateChange.objects.bulk_create([change for _, change in new])
        for walked, change in new:
            walked.created.append(change)
    return walked_all


def no_gguf_files(model: HubModel) -> list[dict[str, Any]] | None:
    """For a head without GGUF files: none listed any more (left listed, the model page showed
    files since deleted, and files restored later matched the list and were not read)."""
    return [] if model.gguf_files else None


def _values(model: HubModel, observation: Observation, walked: _Changes) -> dict[str, Any]:
    """The model's fields after what `observation` saw (`walked`: the changes it recorded)."""
    created, identity, snapshot = walked.created, walked.identity, walked.snapshot
    values: dict[str, Any] = {
        "template_files": observation.files_signature,
        "sync_error": "",
        "sync_failed_at": None,
        "not_found_since": None,
        "last_synced_at": timezone.now(),
    }
    if observation.states:
        values["current_snapshot"] = snapshot
    if observation.history_complete is not None:
        values["history_complete"] = observation.history_complete
    if observation.history_from:
        values["history_from"] = observation.history_from
    if observation.info is not None:
        values |= metadata_fields(observation.info)
    else:
        values |= {
            "last_commit_sha": observation.head_sha,
            "last_commit_at": observation.head_date,
        }
    if observation.facts is not None:
        values |= facts_fields(observation.facts)
        if not model.family and observation.facts.model_type:
            values["family"] = observation.facts.model_type
    if observation.gguf_files is not None:
        values["gguf_files"] = observation.gguf_files
        values |= observation.gguf_facts
        if not model.family and observation.gguf_facts.get("model_type"):
            values["family"] = observation.gguf_facts["model_type"]
    if observation.broken_reason:
        values |= {"status": ModelStatus.BROKEN, "status_reason": observation.broken_reason}
    elif identity is None:
        values |= {"status": ModelStatus.NO_TEMPLATE, "status_reason": "no chat template"}
    else:
        values |= {"status": ModelStatus.OK, "status_reason": ""}
    if created:
        values["last_template_change_at"] = max(c.dated for c in created)
    return values


def record(model_pk: int, observation: Observation) -> SyncResult:
    """Write what a sync observed, all or nothing (`record_many` of one)."""
    return record_many([(model_pk, observation)])[0]


def record_many(observed: list[tuple[int, Observation]]) -> list[SyncResult]:
    """Write what syncs observed, for one model or a batch of them, in one transaction (all or
    nothing), with template_changed for the new changes (its receiver enqueues after commit);
    their results in the order given. Raises HubModel.DoesNotExist when a model is no longer
    tracked.

    A batch takes about the statements of one repo and an update a model: the models' rows
    locked together, their templates, snapshots and changes read and written set-wise, their
    drift refreshed together, one announcement. Repo by repo, the statements, the commits and
    the messages were most of a first sync's time (docs/registry.md)."""
    pks = [pk for pk, _ in observed]
    if len(set(pks)) < len(pks):  # a model read twice: each observation after the one before
        return [record_many([item])[0] for item in observed]
    with transaction.atomic():
        locked = {
            model.pk: model
            for model in HubModel.objects.select_for_update().filter(pk__in=pks).order_by("pk")
        }
        if gone := [pk for pk in pks if pk not in locked]:
            raise HubModel.DoesNotExist(f"models no longer tracked: {gone}")
        results: dict[int, SyncResult] = {}
        todo: list[tuple[HubModel, Observation]] = []
        for pk, observation in observed:
            model = locked[pk]
            if (
                not observation.via_local
                and model.template_files.get("commit") == observation.head_sha
                and model.status in SETTLED
                and not observation.states
            ):
                # A concurrent sync won.
                results[pk] = SyncResult(model.repo_id, "unchanged", model.status)
            else:
                todo.append((model, observation))
        if todo:
            results |= _write(todo)
    return [results[pk] for pk in pks]


def _write(todo: list[tuple[HubModel, Observation]]) -> dict[int, SyncResult]:
    """`record_many`'s writes, for models locked by the caller's transaction."""
    follows = [m.current_snapshot_id for m, o in todo if o.incremental and m.current_snapshot_id]
    currents = TemplateSnapshot.objects.select_related("default_template").prefetch_related(
        "named_templates__version"
    )
    current = currents.in_bulk(follows) if follows else {}
    versions: dict[str, TemplateVersion] = {}
    # A GGUF repo's embedded templates are stored for their checks, in no snapshot.
    _load_versions((text for _, o in todo for text in o.gguf_texts.values()), versions)
    walks = _record_changes(
        [
            (model, o.states, current.get(model.current_snapshot_id) if o.incremental else None)
            for model, o in todo
        ],
        versions,
    )
    for (model, observation), walked in zip(todo, walks, strict=True):
        if changed := _assign(model, _values(model, observation, walked)):
            # A statement a model: Django's bulk_update (a CASE per field and model) cost
            # three times as much for a batch of first syncs, most of it building the CASEs.
            HubModel.objects.filter(pk=model.pk).update(
                **{name: getattr(model, name) for name in changed}
            )
    models = [model for model, _ in todo]
    for model, observation in todo:
        if observation.broken_reason and model.current_snapshot_id is None:
            record_unreadable(model.pk, observation.broken_reason)
    created = [change for walked in walks for change in walked.created]
    if created:
        # In the transaction: the changes and the message about them (an outbox row, sent
        # after commit) are written together.
        _announce([change.pk for change in created])
    # Snapshots and named templates are bulk-created, the models and drift updated in bulk (no
    # post_save): say so to the pages, with what they show where the sync knows it.
    drifted = refresh_drift_many(models)
    shown: dict[int, tuple[str, list[str]]] = {}
    for (model, observation), walked in zip(todo, walks, strict=True):
        if observation.states:  # its current templates are the last state's: said, not looked up
            identity = walked.identity
            shas = [identity[0], *(sha for _, sha in identity[1])] if identity else []
            shown[model.pk] = (model.repo_id, shas)
    model_ids = [*(model.pk for model in models), *drifted]
    catalog_changed.send(sender=HubModel, model_ids=model_ids, shown=shown)
    record_stale_fixes_after_syncs(models, drifted)
    return {
        model.pk: SyncResult(
            model.repo_id, "updated", model.status, len(walked.created), model.status_reason
        )
        for (model, _), walked in zip(todo, walks, strict=True)
    }


def _announce(change_ids: list[int]) -> None:
    template_changed.send(sender=TemplateChange, change_ids=change_ids)


def _head_templates(model: HubModel, start: str) -> dict[str, FoundTemplates]:
    """The templates the first sync read at `start`, by the signature of their files."""
    files = model.template_files if isinstance(model.template_files, dict) else {}
    snapshot = (
        TemplateSnapshot.objects.select_related("default_template")
        .filter(model=model, commit_sha=start)
        .first()
    )
    if files.get("commit") != start or snapshot is None or not files.get("paths"):
        return {}
    return {json.dumps(files["paths"], sort_keys=True): snapshot.found_templates()}


def record_history(
    model_pk: int,
    start: str,
    title: str,
    states: list[CommitTemplates],
    complete: bool,
    facts: ArchitectureFacts | None,
) -> SyncResult:
    """Write the history a backfill found before `start` (the head a first sync read alone),
    all or nothing. Its changes are backfilled: checked, not announced. The head's "first
    template" change becomes the change it really was, or goes if the head changed nothing."""
    with transaction.atomic():
        model = HubModel.objects.select_for_update().get(pk=model_pk)
        if model.history_from != start:
            return SyncResult(model.repo_id, "unchanged", model.status)  # done already
        [walked] = _record_changes([(model, states, None)], {}, backfilled=True)
        created, identity, version = walked.created, walked.identity, walked.version
        head = (
            TemplateSnapshot.objects.select_related("default_template")
            .prefetch_related("named_templates__version")
            .filter(model=model, commit_sha=start)
            .first()
        )
        head_change = TemplateChange.objects.filter(model=model, commit_sha=start).first()
        if _identity_of(head) == identity:
            if head_change is not None and head_change.old_version_id is None:
                head_change.delete()  # the template was there before: the head kept it
        elif head_change is not None and head_change.old_version_id is None:
            head_change.old_version = version
            head_change.title = head_change.title or title
            head_change.save(update_fields=["old_version", "title"])
        elif head_change is None:
            created.append(
                TemplateChange.objects.create(
                    model=model,
                    commit_sha=start,
                    committed_at=head.committed_at if head else None,
                    title=title,
                    old_version=version,
                    new_version=head.default_template if head else None,
                    snapshot=head,
                    backfilled=True,
                )
            )
        values: dict[str, Any] = {"history_from": "", "history_complete": complete}
        if facts is not None:
            values |= facts_fields(facts)
        dated = model.changes.exclude(committed_at=None).aggregate(latest=Max(DATED))
        latest = dated["latest"]
        if latest is not None:
            values["last_template_change_at"] = latest
        changed = _assign(model, values)
        model.save(update_fields=changed)
        if created:
            # In the transaction: the changes and the message about them (an outbox row, sent
            # after commit) are written together.
            _announce([change.pk for change in created])  # checks; no event (backfilled)
        # A base's older templates are known now: a derivative that copied one is "older".
        drifted = refresh_drift_many([model])
        catalog_changed.send(sender=HubModel, model_ids=[model.pk, *drifted])
        record_stale_fixes_after_syncs([model], drifted)
    return SyncResult(model.repo_id, "updated", model.status, len(created), "history")


def backfill_histories(
    limit: int,
    *,
    seconds: float | None = None,
    client: HubClient | None = None,
    clock: Callable[[], float] = time.monotonic,
    model_ids: list[int] | None = None,
) -> list[SyncResult]:
    """Backfill the histories first syncs left for later (of `model_ids` if given), oldest
    first, within `seconds`; stops when the Hub rate-limits us."""
    syncer = RegistrySync(client)
    deadline = clock() + seconds if seconds is not None else None
    results = []
    waiting = HubModel.objects.exclude(history_from="")
    if model_ids is not None:
        waiting = waiting.filter(pk__in=model_ids)
    waiting = waiting.order_by("tracked_at", "id")[:limit]
    for model in waiting:
        if deadline is not None and clock() >= deadline:
            break
        try:
            results.append(syncer.backfill(model))
        except HubUnavailable as err:
            results.append(SyncResult(model.repo_id, "failed", model.status, message=str(err)))
            if err.retry_after is not None:
                break
    return results


def record_unchanged(model_pk: int, info: RepoInfo) -> SyncResult:
    """Nothing new upstream: refresh counters that moved, and the sync time."""
    model = HubModel.objects.get(pk=model_pk)
    changed = _assign(
        model,
        metadata_fields(info) | {"sync_error": "", "sync_failed_at": None, "not_found_since": None},
    )
    model.last_synced_at = timezone.now()
    model.save(update_fields=[*changed, "last_synced_at"])
    return SyncResult(model.repo_id, "unchanged", model.status)


def record_unavailable(
    model_pk: int, status: str, reason: str, info: RepoInfo | None
) -> SyncResult:
    """Gated, private, missing or disabled: say so, and keep the last known templates."""
    model = HubModel.objects.get(pk=model_pk)
    old = model.status
    values: dict[str, Any] = {
        "status": status,
        "status_reason": reason,
        "sync_error": "",
        "sync_failed_at": None,
        "not_found_since": None,
    }
    if info is not None:
        values |= metadata_fields(info)
    changed = _assign(model, values)
    model.last_synced_at = timezone.now()
    with transaction.atomic():
        model.save(update_fields=[*changed, "last_synced_at"])
        # As after any sync: its card may name another base now (model info stays public for
        # a gated repo), and derivatives that name it have a tracked base now, if a first one.
        if drifted := refresh_drift_many([model]):
            catalog_changed.send(sender=HubModel, model_ids=[model.pk, *drifted])
            record_stale_fixes_after_syncs([model], drifted)
        if old != status:
            status_changed.send(
                sender=HubModel, model_pk=model.pk, old=old, new=status, reason=reason
            )
    return SyncResult(model.repo_id, "unavailable", status, message=reason)


def record_failure(model_pk: int, message: str, *, found: bool = False) -> None:
    """The Hub could not be read this time: keep everything, note why (shown on the page).
    `found`: the Hub did answer the repo's model info, so any run of bare 404s has ended."""
    HubModel.objects.filter(pk=model_pk).update(
        sync_error=message[:1000],
        sync_failed_at=timezone.now(),
        **({"not_found_since": None} if found else {}),
    )


#: A repo's model info answered 404 or 410 without the Hub's `X-Error-Code: RepoNotFound`...
NOT_FOUND = (404, 410)
#: ... marks it missing only when the Hub has answered so for this long, with no answer about
#: the repo between: a proxy, a load balancer or a Hub hiccup answers a bare 404 too, and
#: "missing" tells its subscribers the repo is gone. A Hub look-alike that sends no error
#: codes has no other way to say so.
MISSING_AFTER = timedelta(days=1)


def record_not_found(model: HubModel, status: int | None, message: str) -> SyncResult | None:
    """A bare 404 for `model`'s model info: `missing` once the bare 404s have lasted
    `MISSING_AFTER`; else None, a failure to retry, noted with the first one's time kept."""
    now = timezone.now()
    since = model.not_found_since
    if since is not None and now - since >= MISSING_AFTER:
        reason = f"not found on the Hub ({status}) since {since:%Y-%m-%d %H:%M} UTC"
        return record_unavailable(model.pk, ModelStatus.MISSING, reason, None)
    HubModel.objects.filter(pk=model.pk).update(
        sync_error=message[:1000],
        sync_failed_at=now,
        not_found_since=Coalesce("not_found_since", Value(now)),
    )
    return None


#: Observations recorded in one transaction by `sync_concurrently` (`record_many`)...
RECORD_BATCH = 25
#: ... or fewer, once the oldest has waited this long: when the Hub is slow or its quota paces
#: us (one request every 0.6 s anonymous), a repo's verdict does not wait for 24 others.
RECORD_WAIT_SECONDS = 2.0


def sync_concurrently(
    models: Iterable[HubModel],
    *,
    concurrency: int = 1,
    client: HubClient | None = None,
    force: bool = False,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_result: Callable[[SyncResult], None] | None = None,
) -> list[SyncResult]:
    """Sync `models`, `concurrency` at a time, in order of the iterable.

    The Hub is read `concurrency` at a time; what was read is recorded in the calling thread,
    `RECORD_BATCH` repos a transaction (`record_many`, or fewer once the oldest has waited
    `RECORD_WAIT_SECONDS`), and the outcomes that record no templates (unchanged, gone) at
    once. Each thread has its own client (or shares `client`),
    and every client takes its tokens from the credential's shared bucket, so the Hub's rate
    limit holds at any concurrency. No sync starts past `deadline` (of `clock`) or once the
    Hub rate-limited us (the rest wait for the next run); what was read by then is recorded.
    One at a time, everything runs in the calling thread.

    Each pool thread keeps its database connection from one sync to the next, as a web worker's
    thread does from one request to the next, and they are closed once the pool is done:
    closed after every sync, each sync opened a connection (PostgreSQL starts a process for
    each), which made four threads on loopback take 2x the time of one."""
    stop = threading.Event()
    threaded = concurrency > 1
    if not threaded:
        client = client or HubClient()  # one client for the whole run
    own = threading.local()  # without a shared `client`, each thread's own, for all its syncs

    def one(model: HubModel) -> tuple[HubModel, Observation | SyncResult] | None:
        if stop.is_set() or (deadline is not None and clock() >= deadline):
            stop.set()
            return None
        if threaded:
            close_old_connections()  # a broken or expired one, as before a request
        try:
            if client is None and not hasattr(own, "client"):
                own.client = HubClient()
            return model, RegistrySync(client or own.client).look(model, force=force)
        except HubUnavailable as err:
            if err.retry_after is not None:
                stop.set()
            failed = SyncResult(
                model.repo_id, "failed", model.status, message=str(err), retry_after=err.retry_after
            )
            return model, failed
        except SoftTimeLimitExceeded:
            raise  # the task's time is up: the run stops here, not this repo alone
        except Exception as exc:
            return model, sync_failed(model, "reading the repo", exc)

    # Each result at the place of its model in `models` (a recorded one comes after the next).
    placed: list[tuple[int, SyncResult]] = []
    waiting: list[tuple[int, HubModel, Observation]] = []
    first_waiting = [0.0]  # when the oldest of `waiting` was read

    def done(place: int, result: SyncResult) -> None:
        placed.append((place, result))
        if on_result is not None:
            on_result(result)

    def record_waiting() -> None:
        batch = waiting[:]
        waiting.clear()
        recorded = record_batch([(model, observation) for _, model, observation in batch])
        places = {model.repo_id: place for place, model, _ in batch}
        for result in recorded:
            done(places[result.repo_id], result)

    def take(place: int, model: HubModel, found: Observation | SyncResult) -> None:
        if isinstance(found, SyncResult):
            done(place, found)
        else:
            if not waiting:
                first_waiting[0] = time.monotonic()
            waiting.append((place, model, found))
        if waiting and (
            len(waiting) >= RECORD_BATCH
            or time.monotonic() - first_waiting[0] >= RECORD_WAIT_SECONDS
        ):
            record_waiting()

    def in_order() -> list[SyncResult]:
        return [result for _, result in sorted(placed, key=lambda pair: pair[0])]

    if not threaded:
        for place, model in enumerate(models):
            seen = one(model)
            if seen is None:
                break
            take(place, *seen)
        record_waiting()
        return in_order()
    close_old_connections()
    # Each thread's connection handles, taken in the thread (Django's are per thread), so that
    # this thread can close them once the pool has stopped.
    handles: list[BaseDatabaseWrapper] = []

    def take_handles() -> None:
        handles.extend(connections[alias] for alias in connections)

    try:
        with ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="sync", initializer=take_handles
        ) as pool:
            for place, seen in enumerate(pool.map(one, models)):
                if seen is not None:
                    take(place, *seen)
        record_waiting()
    finally:
        for handle in handles:
            handle.inc_thread_sharing()  # its thread has ended
            handle.close()
    return in_order()


def record_batch(batch: list[tuple[HubModel, Observation]]) -> list[SyncResult]:
    """Record `batch` in one transaction. If that fails, each repo on its own, so that one the
    batch cannot record (a model untracked since: skipped; anything else: `sync_failed`)
    costs no other its sync, nor the rest of the run."""
    if not batch:
        return []
    try:
        return record_many([(model.pk, observation) for model, observation in batch])
    except HubModel.DoesNotExist:
        pass  # untracked while its repo was read: the others are recorded without it
    except Exception:
        logger.warning("could not record %d syncs together; one at a time", len(batch))
    results: list[SyncResult] = []
    for model, observation in batch:
        try:
            results.append(record(model.pk, observation))
        except HubModel.DoesNotExist:
            logger.info("%s is no longer tracked: its sync is not recorded", model.repo_id)
        except Exception as exc:
            results.append(sync_failed(model, "recording what the sync read", exc))
    return results


def sync_failed(model: HubModel, doing: str, exc: Exception) -> SyncResult:
    """A sync that failed for a reason no sync expects (a bug, or input nothing checks yet):
    logged with its traceback, and noted on the model (`record_failure`, shown on its page)
    with what was kept, so that a batch goes on with the next repo."""
    logger.error("%s: failed %s", model.repo_id, doing, exc_info=exc)
    message = f"sync failed {doing} ({type(exc).__name__}); the last good sync is kept"
    record_failure(model.pk, message)
    return SyncResult(model.repo_id, "failed", model.status, message=message)


def sync_repo_ids(
    repo_ids: list[str] | None,
    *,
    force: bool = False,
    client: HubClient | None = None,
    concurrency: int = 1,
    history: bool = False,
) -> list[SyncResult]:
    """Sync the named repos (tracking the untracked ones), or every tracked Hub repo; with
    `history`, then backfill the history of those a first sync read the head of."""
    if repo_ids:
        models = [HubModel.objects.track(r, via="track")[0] for r in repo_ids]
    else:
        models = list(HubModel.objects.stalest())
    results = sync_concurrently(models, concurrency=concurrency, client=client, force=force)
    if history:
        # What the first syncs left for later, now: a command's caller wants the whole story.
        pending = [m.pk for m in models]
        results += backfill_histories(len(pending), client=client, model_ids=pending)
    return results


def sync_batch(
    model_pks: list[int], *, force: bool = False, concurrency: int = 1
) -> tuple[list[SyncResult], list[int]]:
    """Sync the models of a batch (a discovery's or a watch's new repos), `concurrency` at a
    time; return the results and the models to try again later: those the Hub could not
    serve, and once it rate-limited us those not started. A model untracked since is skipped."""
    models = HubModel.objects.in_bulk(model_pks)
    results = sync_concurrently(
        [models[pk] for pk in model_pks if pk in models], concurrency=concurrency, force=force
    )
    done = {r.repo_id for r in results if r.outcome != "failed"}
    again = [pk for pk in model_pks if pk in models and models[pk].repo_id not in done]
    return results, again


def sync_stalest(
    limit: int,
    *,
    seconds: float | None = None,
    client: HubClient | None = None,
    clock: Callable[[], float] = time.monotonic,
    concurrency: int = 1,
) -> list[SyncResult]:
    """Sync up to `limit` of the repos synced longest ago, within `seconds`; stops early when
    the Hub rate-limits us (the rest wait for the next run)."""
    deadline = clock() + seconds if seconds is not None else None
    models = list(HubModel.objects.stalest()[:limit])
    return sync_concurrently(
        models, concurrency=concurrency, client=client, deadline=deadline, clock=clock
    )
