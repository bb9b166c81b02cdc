"""A small demo catalog, so a fresh install shows something: templates written for CacheSafe."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from .models import (
    HubModel,
    ModelStatus,
    NamedTemplate,
    SourceFile,
    TemplateSnapshot,
    TemplateVersion,
)
from .verdicts import check_in_process, record_check

DEMO_DIR = Path(__file__).resolve().parent / "demo"


@dataclass(frozen=True)
class DemoModel:
    repo_id: str
    template_file: str
    family: str
    tags: tuple[str, ...]
    downloads: int
    model_type: str
    is_hybrid: bool = False


DEMO_MODELS = (
    DemoModel(
        "cachesafe-demo/chatml-tools-7b",
        "chatml-safe.jinja",
        "chatml",
        ("text-generation", "tools"),
        120_000,
        "qwen2",
    ),
    DemoModel(
        "cachesafe-demo/marker-chat-8b",
        "moving-marker-unsafe.jinja",
        "marker",
        ("text-generation",),
        45_000,
        "llama",
    ),
    DemoModel(
        "cachesafe-demo/thinker-30b-a3b",
        "thinking-strip.jinja",
        "thinker",
        ("text-generation", "reasoning"),
        80_000,
        "qwen3_next",
        True,
    ),
)


@transaction.atomic
def seed_demo_catalog() -> int:
    """Create the demo models that are missing; return how many were created."""
    created = 0
    for demo in DEMO_MODELS:
        if HubModel.objects.filter(repo_id=demo.repo_id).exists():
            continue
        text = (DEMO_DIR / demo.template_file).read_text(encoding="utf-8")
        version, _ = TemplateVersion.objects.get_or_create_for_text(text)
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
            last_commit_sha="0" * 40,
            last_synced_at=timezone.now(),
            last_template_change_at=timezone.now(),
            is_demo=True,
        )
        snapshot = TemplateSnapshot.objects.create(
            model=model,
            commit_sha="0" * 40,
            source_file=SourceFile.LOCAL,
            default_template=version,
            special_tokens={"bos_token": "<s>", "eos_token": "<|im_end|>"},
        )
        NamedTemplate.objects.create(snapshot=snapshot, name="default", version=version)
        model.current_snapshot = snapshot
        model.save(update_fields=["current_snapshot"])
        # The demo templates are ours, so the engine may run here, outside the sandbox pool.
        record_check(version, check_in_process(version, snapshot.special_tokens))
        created += 1
    return created
