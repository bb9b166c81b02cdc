"""Catalog rows for pipeline tests: models, snapshots and changes, as a sync writes them."""

from __future__ import annotations

import hashlib
from pathlib import Path

from registry.models import (
    HubModel,
    ModelStatus,
    NamedTemplate,
    SourceFile,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
)

DEMO = Path(__file__).resolve().parent.parent / "registry" / "demo"
SAFE_TEMPLATE = (DEMO / "chatml-safe.jinja").read_text()
UNSAFE_TEMPLATE = (DEMO / "moving-marker-unsafe.jinja").read_text()
#: Burns about a second per check inside the sandbox, so a test can act while it runs.
SLOW_PREFIX = "{%- for i in range(1500) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"


def add_model(repo_id: str, text: str, *, downloads: int = 0) -> HubModel:
    """A tracked model whose current template is `text`, with the change event a sync writes."""
    version, _ = TemplateVersion.objects.get_or_create_for_text(text)
    commit = hashlib.sha1(f"{repo_id}:{version.sha256}".encode()).hexdigest()
    model = HubModel.objects.create(
        repo_id=repo_id, author=repo_id.split("/")[0], status=ModelStatus.OK, downloads=downloads
    )
    snapshot = TemplateSnapshot.objects.create(
        model=model,
        commit_sha=commit,
        source_file=SourceFile.TOKENIZER_CONFIG,
        default_template=version,
        special_tokens={"bos_token": "<s>", "eos_token": "<|im_end|>"},
    )
    NamedTemplate.objects.create(snapshot=snapshot, name="default", version=version)
    HubModel.objects.filter(pk=model.pk).update(current_snapshot=snapshot, last_commit_sha=commit)
    TemplateChange.objects.create(model=model, commit_sha=commit, new_version=version)
    model.refresh_from_db()
    return model
