"""A fake Hugging Face Hub for the registry's tests and benchmark (see server.py)."""

from __future__ import annotations

from .corpus import build_corpus_hub, build_scaled_hub, load_corpus
from .server import FakeHub, Fault, HubState, LoggedRequest
from .store import FakeCommit, FakeRepo, RepoStore, blob_oid

__all__ = [
    "FakeCommit",
    "FakeHub",
    "FakeRepo",
    "Fault",
    "HubState",
    "LoggedRequest",
    "RepoStore",
    "blob_oid",
    "build_corpus_hub",
    "build_scaled_hub",
    "load_corpus",
]
