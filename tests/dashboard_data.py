"""A small catalog for the dashboard tests: the demo models (checked by the real engine), a model
whose template changed, a model still being checked, and a template full of markup."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.utils import timezone

from checks import ENGINE_VERSION
from registry.demo import seed_demo_catalog
from registry.models import (
    CheckRun,
    CheckStatus,
    HubModel,
    ModelStatus,
    NamedTemplate,
    SourceFile,
    TemplateSnapshot,
    TemplateVersion,
)
from registry.verdicts import check_in_process, record_check, refresh_verdicts

TOKENS = {"bos_token": "<s>", "eos_token": "<|im_end|>"}
# Hub text that must never become markup: a script, an attribute breakout, a fake closing tag.
HOSTILE_TEMPLATE = (
    "{#- <script>alert('template')</script> -#}\n"
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    '<think>"><img src=x onerror=alert(1)></think>\n'
    "{% endif %}"
)
HOSTILE_REPO = "evil-org/script-model"
CHANGED_REPO = "cachesafe-demo/thinker-30b-a3b"
PENDING_REPO = "slow-org/pending-model"


@dataclass(frozen=True)
class Catalog:
    unsafe: HubModel
    safe: HubModel
    changed: HubModel
    pending: HubModel
    hostile: HubModel
    old_version: TemplateVersion


def add_model(
    repo_id: str,
    text: str,
    *,
    commit: str,
    check: bool = True,
    downloads: int = 1000,
    **fields: object,
) -> HubModel:
    """A tracked model whose current template is `text`, checked by the real engine if asked."""
    version, _ = TemplateVersion.objects.get_or_create_for_text(text)
    model = HubModel.objects.create(
        repo_id=repo_id,
        author=repo_id.split("/")[0],
        status=ModelStatus.OK,
        downloads=downloads,
        last_template_change_at=timezone.now(),
        **fields,
    )
    snapshot = TemplateSnapshot.objects.create(
        model=model,
        commit_sha=commit,
        source_file=SourceFile.CHAT_TEMPLATE_JINJA,
        default_template=version,
        special_tokens=TOKENS,
    )
    model.current_snapshot = snapshot
    model.save(update_fields=["current_snapshot"])
    if check:
        record_check(version, check_in_process(version, TOKENS))
    model.refresh_from_db()
    return model


def without_default(model: HubModel, tool_use: TemplateVersion) -> HubModel:
    """`model` filed as a sync files a repo whose named templates are `rag` (its template) and
    `tool_use`, none `default`: the first by name stands in as its `default_template`."""
    snapshot = model.current_snapshot
    assert snapshot is not None
    snapshot.named_templates.all().delete()
    NamedTemplate.objects.create(snapshot=snapshot, name="rag", version=snapshot.default_template)
    NamedTemplate.objects.create(snapshot=snapshot, name="tool_use", version=tool_use)
    refresh_verdicts([snapshot.default_template_id, tool_use.pk], model_ids=[model.pk])
    model.refresh_from_db()
    return model


def build_catalog() -> Catalog:
    seed_demo_catalog()
    thinker = HubModel.objects.get(repo_id=CHANGED_REPO)
    # The demo's history: the thinker's template used to be a plain, cache-safe one.
    first = thinker.changes.order_by("committed_at").first()
    assert first is not None and first.new_version is not None
    old_version = first.new_version
    now = timezone.now()
    pending = add_model(
        PENDING_REPO, "{{ messages[0].content }} pending", commit="c" * 40, check=False
    )
    version = pending.current_snapshot.default_template  # type: ignore[union-attr]
    CheckRun.objects.create(
        template_version=version,
        engine_version=ENGINE_VERSION,
        status=CheckStatus.RUNNING,
        progress=40,
        started_at=now,
    )
    hostile = add_model(
        HOSTILE_REPO,
        HOSTILE_TEMPLATE,
        commit="d" * 40,
        family="<b>fam</b>",
        tags=["<script>alert('tag')</script>"],
    )
    return Catalog(
        unsafe=HubModel.objects.get(repo_id="cachesafe-demo/marker-chat-8b"),
        safe=HubModel.objects.get(repo_id="cachesafe-demo/chatml-tools-7b"),
        changed=HubModel.objects.get(repo_id=CHANGED_REPO),
        pending=pending,
        hostile=hostile,
        old_version=old_version,
    )


@pytest.fixture
def healthy_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the worker and beat are alive: no status banner, and no status queries to count."""
    from cachesafe import context_processors
    from dashboard import page_cache
    from workers.health import Component, ServiceStatus

    ok = Component(True, "ok")
    status = ServiceStatus(ok, ok, ok, ok, ok)
    monkeypatch.setattr(context_processors, "cached_status", lambda: status)
    monkeypatch.setattr(page_cache, "cached_status", lambda: status)  # a page's key reads it
