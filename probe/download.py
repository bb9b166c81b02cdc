"""Fetch only the files mlx-lm needs for one model, within a disk budget, and clean up after."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: mlx-lm's own list minus `*.py`: the probe never runs a repository's remote code.
ALLOW_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]


class DownloadError(RuntimeError):
    """A model could not be fetched; the message says why, for the report."""


@dataclass(frozen=True)
class DownloadSpec:
    """Which repository files to fetch, from where, and how much disk they may take."""

    repo_id: str
    revision: str | None = None
    disk_budget_bytes: int | None = None
    endpoint: str | None = None
    token: str | None = None
    work_dir: str | None = None

    @classmethod
    def from_job(cls, job: dict[str, Any]) -> DownloadSpec:
        spec = job.get("download") or {}
        return cls(
            repo_id=str(spec.get("repo_id") or job["repo_id"]),
            revision=spec.get("revision") or job.get("revision"),
            disk_budget_bytes=spec.get("disk_budget_bytes", job.get("disk_budget_bytes")),
            endpoint=spec.get("endpoint"),
            token=spec.get("token"),
            work_dir=spec.get("work_dir"),
        )


def _describe(exc: BaseException) -> str:
    """The exception and, when the Hub client wrapped it, the root cause (refused, 404...)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    root: BaseException = exc
    for _ in range(10):  # chains are short; never loop on a pathological one
        following = root.__cause__ or root.__context__
        if following is None:
            break
        root = following
    if root is not exc:
        text += f" (cause: {type(root).__name__}: {root})"
    return text


def planned_files(spec: DownloadSpec) -> tuple[str, list[tuple[str, int]]]:
    """The commit the revision resolves to, and the (file, bytes) a download would write."""
    from huggingface_hub import snapshot_download

    try:
        infos = snapshot_download(
            spec.repo_id,
            revision=spec.revision,
            allow_patterns=ALLOW_PATTERNS,
            endpoint=spec.endpoint,
            token=spec.token,
            dry_run=True,
        )
    except Exception as exc:
        raise DownloadError(
            f"cannot list files of {spec.repo_id}@{spec.revision or 'main'}: {_describe(exc)}"
        ) from exc
    if not isinstance(infos, list) or not infos:
        raise DownloadError(f"{spec.repo_id}: no model files match {ALLOW_PATTERNS}")
    files = [(i.filename, int(i.file_size or 0)) for i in infos]
    return str(infos[0].commit_hash), files


@contextmanager
def downloaded_model(spec: DownloadSpec) -> Iterator[tuple[Path, str]]:
    """Download into a fresh directory, yield (model dir, commit), and delete it afterwards.

    Refuses before writing anything when the files exceed the budget or the free space.
    """
    from huggingface_hub import snapshot_download

    commit, files = planned_files(spec)
    needed = sum(size for _, size in files)
    if spec.disk_budget_bytes is not None and needed > spec.disk_budget_bytes:
        raise DownloadError(
            f"{spec.repo_id}@{commit[:12]} needs {needed} bytes for {len(files)} files, "
            f"over the disk budget of {spec.disk_budget_bytes} bytes"
        )
    root = Path(tempfile.mkdtemp(prefix="probe-model-", dir=spec.work_dir))
    try:
        free = shutil.disk_usage(root).free
        if needed > free:
            raise DownloadError(f"{spec.repo_id} needs {needed} bytes, {free} free on disk")
        try:
            path = snapshot_download(
                spec.repo_id,
                revision=commit,
                allow_patterns=ALLOW_PATTERNS,
                local_dir=root / "model",
                endpoint=spec.endpoint,
                token=spec.token,
            )
        except Exception as exc:
            raise DownloadError(
                f"download of {spec.repo_id}@{commit[:12]} failed: {_describe(exc)}"
            ) from exc
        yield Path(str(path)), commit
    finally:
        shutil.rmtree(root, ignore_errors=True)
