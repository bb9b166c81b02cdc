"""A small demo catalog, so a fresh install shows something: templates written for CacheSafe.

It looks like data a sync would write, so every page has something to show: commit ids, commit
dates, a first "template added" change per model, and one model whose template changed later
(history, version diff and the changes feed). Commit ids are made up but stable (a digest of the
repo, file and title), so a pinned link to a demo page keeps working across re-seeds. Every demo
model is marked `is_demo`, and the pages say so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from .models import (
    HubModel,
    ModelStatus,
    NamedTemplate,
    SourceFile,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
)
from .verdicts import check_in_process, record_check

DEMO_DIR = Path(__file__).resolve().parent / "demo"


@dataclass(frozen=True)
class DemoCommit:
    """A commit that set the repo's chat template, `days_ago` days before seeding."""

    template_file: str
    title: str
    days_ago: int


@dataclass(frozen=True)
class DemoModel:
    repo_id: str
    history: tuple[DemoCommit, ...]  # oldest first; the last one is the current template
    family: str
    tags: tuple[str, ...]
    downloads: int
    model_type: str
    is_hybrid: bool = False

    @property
    def template_file(self) -> str:
        return self.history[-1].template_file


def demo_commit_sha(repo_id: str, commit: DemoCommit) -> str:
    """A stable, made-up commit id for a demo commit."""
    return hashlib.sha1(f"{repo_id}\n{commit.template_file}\n{commit.title}".encode()).hexdigest()


DEMO_MODELS = (
    DemoModel(
        "cachesafe-demo/chatml-tools-7b",
        (DemoCommit("chatml-safe.jinja", "Add chat template with tool calls", 41),),
        "chatml",
        ("text-generation", "tools"),
        120_000,
        "qwen2",
    ),
    DemoModel(
        "cachesafe-demo/marker-chat-8b",
        (DemoCommit("moving-marker-unsafe.jinja", "Initial chat template", 19),),
        "marker",
        ("text-generation",),
        45_000,
        "llama",
    ),
    DemoModel(
        "cachesafe-demo/thinker-30b-a3b",
        (
            DemoCommit("thinking-plain.jinja", "Initial chat template", 62),
            DemoCommit("thinking-strip.jinja", "Strip reasoning from earlier turns", 3),
        ),
        "thinker",
        ("text-generation", "reasoning"),
        80_000,
        "qwen3_next",
        True,
    ),
)


TOKENS = {"bos_token": "<s>", "eos_token": "<|im_end|>"}


@transaction.atomic
def seed_demo_catalog() -> int:
    """Create the demo models that are missing; return how many were created."""
    created = 0
    now = timezone.now()
    for demo in DEMO_MODELS:
        if HubModel.objects.filter(repo_id=demo.repo_id).exists():
            continue
        latest = demo.history[-1]
        model = HubModel.objects.create(
            repo_id=demo.repo_id,
            author=demo.repo_id.split("/")[0],
            family=demo.family,
            status=ModelStatus.OK,
            tags=list(demo.tags),
            pipeline_tag="text-generation",
            model_type=demo.model_type,
            is_hybrid=demo.is_hybrid,
            downloads=demo.downloads,
            last_commit_sha=demo_commit_sha(demo.repo_id, latest),
            last_synced_at=now,
            last_template_change_at=now - timedelta(days=latest.days_ago),
            is_demo=True,
        )
        old: TemplateVersion | None = None
        snapshot: TemplateSnapshot | None = None
        versions: list[TemplateVersion] = []
        for commit in demo.history:
            text = (DEMO_DIR / commit.template_file).read_text(encoding="utf-8")
            version, _ = TemplateVersion.objects.get_or_create_for_text(text)
            sha = demo_commit_sha(demo.repo_id, commit)
            committed_at = now - timedelta(days=commit.days_ago)
            snapshot = TemplateSnapshot.objects.create(
                model=model,
                commit_sha=sha,
                committed_at=committed_at,
                source_file=SourceFile.CHAT_TEMPLATE_JINJA,
                default_template=version,
                special_tokens=TOKENS,
            )
            NamedTemplate.objects.create(snapshot=snapshot, name="default", version=version)
            # Claimed already: the demo is checked right here, and nobody subscribed to it yet.
            TemplateChange.objects.create(
                model=model,
                commit_sha=sha,
                committed_at=committed_at,
                title=commit.title,
                old_version=old,
                new_version=version,
                snapshot=snapshot,
                checks_claimed_at=now,
                alerts_claimed_at=now,
            )
            old = version
            versions.append(version)
        model.current_snapshot = snapshot
        model.save(update_fields=["current_snapshot"])
        # The demo templates are ours, so the engine may run here, outside the sandbox pool.
        # The current one last: its check is the one that writes the model's verdict.
        for version in versions:
            if not version.check_runs.exists():
                record_check(version, check_in_process(version, TOKENS))
        created += 1
    return created
