"""The fake Hub's in-memory repositories: commits of byte trees, with git-like object ids."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

#: Files the fake serves through LFS (as the real Hub does for tokenizer.json and weights).
LFS_FILES = frozenset({"tokenizer.json", "model.safetensors"})
LFS_SUFFIXES = (".gguf", ".safetensors")


def is_lfs(path: str) -> bool:
    return path in LFS_FILES or path.endswith(LFS_SUFFIXES)


_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


def blob_oid(data: bytes) -> str:
    """Git's blob id: what the Hub reports as `oid` / `blobId` for a file stored in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_oid(entries: dict[str, bytes], prefix: str) -> str:
    """A stable id for a folder: changes whenever any file below it changes."""
    digest = hashlib.sha1(b"tree\0")
    for path in sorted(entries):
        if path.startswith(prefix + "/"):
            digest.update(path.encode() + b"\0" + blob_oid(entries[path]).encode())
    return digest.hexdigest()


@dataclass
class FakeCommit:
    sha: str
    title: str
    date: datetime
    files: dict[str, bytes]


@dataclass
class FakeRepo:
    repo_id: str
    commits: list[FakeCommit] = field(default_factory=list)  # oldest first
    gated: str | bool = False  # False, "auto" or "manual"
    private: bool = False
    disabled: bool = False
    downloads: int = 0
    likes: int = 0
    trending_score: int = 0
    tags: list[str] = field(default_factory=list)
    pipeline_tag: str | None = "text-generation"
    library_name: str | None = "transformers"
    base_model: str | None = None
    #: Tokens allowed to read a gated or private repo.
    allowed_tokens: set[str] = field(default_factory=set)

    @property
    def author(self) -> str:
        return self.repo_id.split("/", 1)[0]

    @property
    def head(self) -> FakeCommit:
        return self.commits[-1]

    def commit_at(self, revision: str) -> FakeCommit | None:
        if revision in ("main", "HEAD"):
            return self.head
        for commit in self.commits:
            if commit.sha == revision or (len(revision) >= 7 and commit.sha.startswith(revision)):
                return commit
        return None

    def card_data(self) -> dict[str, object]:
        card: dict[str, object] = {"tags": self.tags}
        if self.base_model:
            card["base_model"] = self.base_model
        return card

    def config_summary(self, commit: FakeCommit) -> dict[str, object] | None:
        """The subset of config.json the Hub returns inside model info."""
        raw = commit.files.get("config.json")
        if raw is None:
            return None
        try:
            config = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(config, dict):
            return None
        return {k: config[k] for k in ("architectures", "model_type") if k in config}


class RepoStore:
    """Thread-safe store of repos; the helpers are what tests use to change the fake Hub."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.repos: dict[str, FakeRepo] = {}
        self._clock = _EPOCH
        self._serial = 0

    def _tick(self) -> datetime:
        self._clock += timedelta(hours=1)
        return self._clock

    def _sha(self, repo_id: str, title: str) -> str:
        self._serial += 1
        return hashlib.sha1(f"{repo_id}\0{title}\0{self._serial}".encode()).hexdigest()

    def create_repo(self, repo_id: str, **attrs: object) -> FakeRepo:
        """A repo with the Hub's initial commit (.gitattributes only)."""
        with self.lock:
            repo = FakeRepo(repo_id=repo_id)
            for key, value in attrs.items():
                setattr(repo, key, value)
            repo.commits.append(
                FakeCommit(
                    sha=self._sha(repo_id, "initial commit"),
                    title="initial commit",
                    date=self._tick(),
                    files={".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs\n"},
                )
            )
            self.repos[repo_id] = repo
            return repo

    def add_commit(
        self, repo_id: str, files: Mapping[str, bytes | str | None], title: str = "Update files"
    ) -> FakeCommit:
        """Commit on top of the head: a None value deletes the file."""
        with self.lock:
            repo = self.repos[repo_id]
            tree = dict(repo.head.files)
            for path, data in files.items():
                if data is None:
                    tree.pop(path, None)
                else:
                    tree[path] = data.encode() if isinstance(data, str) else data
            commit = FakeCommit(self._sha(repo_id, title), title, self._tick(), tree)
            repo.commits.append(commit)
            return commit

    def squash(self, repo_id: str, title: str = "Super-squash branch 'main'") -> FakeCommit:
        """`HfApi.super_squash_history`: one new commit holds the head's files, and every
        commit before it is gone."""
        with self.lock:
            repo = self.repos[repo_id]
            commit = FakeCommit(self._sha(repo_id, title), title, self._tick(), repo.head.files)
            repo.commits[:] = [commit]
            return commit

    def get(self, repo_id: str) -> FakeRepo | None:
        with self.lock:
            return self.repos.get(repo_id)

    def remove(self, repo_id: str) -> None:
        with self.lock:
            self.repos.pop(repo_id, None)

    def set(self, repo_id: str, **attrs: object) -> None:
        """Change a repo's flags (gated, private, disabled, downloads, …)."""
        with self.lock:
            repo = self.repos[repo_id]
            for key, value in attrs.items():
                setattr(repo, key, value)

    def all(self) -> list[FakeRepo]:
        with self.lock:
            return list(self.repos.values())
