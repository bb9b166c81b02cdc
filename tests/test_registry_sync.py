"""Sync against the fake Hub, through the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from registry.api import model_json
from registry.hub import HubClient, HubUnavailable
from registry.models import (
    EventKind,
    HubModel,
    ModelEvent,
    ModelStatus,
    NamedTemplate,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
)
from registry.pipeline import claim_template_changes
from registry.signals import template_changed
from registry.sync import MISSING_AFTER, RegistrySync, SyncResult, backfill_histories
from tests.fakehub import FakeHub, load_corpus
from tests.fakehub.corpus import tokenizer_config, upload_files
from tests.fakehub.fixtures import Sleeps, corpus_hub, fake_hub, hub_settings, sleeps

pytestmark = pytest.mark.django_db
__all__ = ["corpus_hub", "fake_hub", "hub_settings", "sleeps"]

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
TOOLS = CHATML + "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"


@pytest.fixture
def syncer(hub_settings: Any, sleeps: Sleeps) -> RegistrySync:
    return RegistrySync(HubClient(sleep=sleeps, clock=sleeps.clock, timeout=2))


@pytest.fixture
def sync(syncer: RegistrySync) -> Callable[..., SyncResult]:
    """A sync as `sync_hub` runs it: a new repo's head, then the history before it."""

    def run(repo_id: str, **options: Any) -> SyncResult:
        model, _ = HubModel.objects.track(repo_id, via="track")
        result = syncer.sync(model, **options)
        model.refresh_from_db()
        if model.history_from:
            syncer.backfill(model)
        return result

    return run


def upload(hub: FakeHub, repo_id: str, files: dict[str, Any], **attrs: Any) -> str:
    hub.store.create_repo(repo_id, **attrs)
    return hub.store.add_commit(repo_id, files, "Upload model").sha


def tc(template: Any = None, **extra: Any) -> bytes:
    """A tokenizer_config.json with `template` as its chat_template (any JSON value)."""
    config: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>", **extra}
    if template is not None:
        config["chat_template"] = template
    return json.dumps(config).encode()


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def api(repo_id: str) -> dict[str, Any]:
    return model_json(HubModel.objects.get(repo_id=repo_id))


# --- the corpus, end to end -------------------------------------------------------------------


def test_every_corpus_repo_syncs_with_byte_exact_templates_and_full_history(
    corpus_hub: FakeHub, corpus_dir: Path, sync: Callable[..., SyncResult]
) -> None:
    versions: dict[str, list[str]] = {}
    for template in load_corpus(corpus_dir):
        versions.setdefault(template.repo_id, []).append(sha(template.text))
    for repo_id in versions:
        assert sync(repo_id).status == ModelStatus.OK, repo_id
    index = {i["file"]: i["sha256"] for i in json.loads((corpus_dir / "index.json").read_text())}
    assert set(index.values()) >= {s for shas in versions.values() for s in shas}
    for repo_id, shas in versions.items():
        shown = api(repo_id)
        # CRLF templates (Kimi K2, Nemotron 3) hash as published: bytes are never rewritten.
        assert shown["template"]["sha256"] == shas[-1], repo_id
        assert [h["template_sha256"] for h in shown["history"]] == list(reversed(shas)), repo_id
        assert shown["history_complete"] is True
    # One row per distinct text: repos that share a template share its version.
    assert TemplateVersion.objects.count() == len({s for shas in versions.values() for s in shas})


def test_architecture_facts_come_from_config_json(
    corpus_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    for repo_id in (
        "Qwen/Qwen3.5-4B",
        "google/gemma-2-2b-it",
        "TheBloke/Mistral-7B-Instruct-v0.1-GPTQ",
        "LiquidAI/LFM2-8B-A1B",
    ):
        sync(repo_id)
    qwen35, gemma = api("Qwen/Qwen3.5-4B"), api("google/gemma-2-2b-it")
    assert (qwen35["is_hybrid"], qwen35["has_sliding_window"]) == (True, False)
    assert qwen35["model_type"] == "qwen3_5"
    assert (gemma["is_hybrid"], gemma["has_sliding_window"]) == (False, True)
    assert api("TheBloke/Mistral-7B-Instruct-v0.1-GPTQ")["quantization"] == "gptq 4-bit"
    assert api("LiquidAI/LFM2-8B-A1B")["is_hybrid"] is True
    assert qwen35["template"]["tokenizer_json"]["size"] > 0
    assert len(qwen35["template"]["tokenizer_json"]["sha"]) == 64  # LFS: the SHA-256


# --- history ----------------------------------------------------------------------------------


def test_backfill_is_bounded_and_newest_first(
    fake_hub: FakeHub, hub_settings: Any, sync: Callable[..., SyncResult]
) -> None:
    hub_settings.REGISTRY_HISTORY_LIMIT = 5
    fake_hub.state.commits_page_size = 2
    upload(fake_hub, "org/long-history", {"tokenizer_config.json": tc(CHATML + "{# 0 #}")})
    commits = [
        fake_hub.store.add_commit(
            "org/long-history", {"tokenizer_config.json": tc(CHATML + f"{{# {n} #}}")}, f"v{n}"
        )
        for n in range(1, 9)
    ]
    sync("org/long-history")
    history = api("org/long-history")["history"]
    assert [h["commit"] for h in history] == [c.sha for c in reversed(commits[-5:])]
    assert [h["title"] for h in history] == ["v8", "v7", "v6", "v5", "v4"]
    assert history[0]["previous_sha256"] == history[1]["template_sha256"]
    assert api("org/long-history")["history_complete"] is False
    pages = [r for r in fake_hub.requests("org/long-history") if "/commits/" in r.path]
    assert len(pages) == 3  # 5 commits at 2 a page: the sixth and later pages are never asked


def test_upstream_change_between_two_syncs_is_one_event_at_its_commit(
    fake_hub: FakeHub,
    sync: Callable[..., SyncResult],
    django_capture_on_commit_callbacks: Any,
) -> None:
    upload(fake_hub, "org/model", {"tokenizer_config.json": tc(CHATML), "README.md": b"hi"})
    sync("org/model")
    received: list[int] = []

    def receiver(sender: Any, change_ids: list[int], **kwargs: Any) -> None:
        received.extend(change_ids)

    template_changed.connect(receiver)
    try:
        changed = fake_hub.store.add_commit(
            "org/model", {"tokenizer_config.json": tc(TOOLS)}, "Fix tool calls"
        )
        fake_hub.store.add_commit("org/model", {"README.md": b"docs"}, "Update README.md")
        with django_capture_on_commit_callbacks(execute=True):
            result = sync("org/model")
        with django_capture_on_commit_callbacks(execute=True):
            again = sync("org/model")
    finally:
        template_changed.disconnect(receiver)
    assert (result.changes, again.changes, again.outcome) == (1, 0, "unchanged")
    history = api("org/model")["history"]
    assert [h["commit"] for h in history][:1] == [changed.sha]
    assert history[0] == {
        "commit": changed.sha,
        "date": changed.date.isoformat(),
        "title": "Fix tool calls",
        "template_sha256": sha(TOOLS),
        "previous_sha256": sha(CHATML),
    }
    assert len(history) == 2
    assert received == [TemplateChange.objects.get(commit_sha=changed.sha).pk]


def test_second_sync_asks_once_per_repo_and_writes_nothing_but_the_sync_time(
    corpus_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    repo_ids = sorted(r.repo_id for r in corpus_hub.store.all())[:15]
    for repo_id in repo_ids:
        sync(repo_id)
    before = {r: api(r) for r in repo_ids}
    counts = (
        TemplateVersion.objects.count(),
        TemplateSnapshot.objects.count(),
        TemplateChange.objects.count(),
    )
    assert counts[2] >= len(repo_ids)
    corpus_hub.reset_log()
    with CaptureQueriesContext(connection) as queries:
        results = [sync(r) for r in repo_ids]
    assert {r.outcome for r in results} == {"unchanged"}
    assert {r: len(corpus_hub.requests(r)) for r in repo_ids} == dict.fromkeys(repo_ids, 1)
    writes = [
        q["sql"]
        for q in queries
        if '"registry_' in q["sql"] and not q["sql"].lstrip().upper().startswith("SELECT")
    ]
    # One UPDATE per repo, of the sync time alone (the rate-limit bucket lives in the cache).
    assert len(writes) == len(repo_ids)
    assert all(w.startswith('UPDATE "registry_hubmodel" SET "last_synced_at"') for w in writes)
    assert all(w.count(" = ") == 2 for w in writes), writes  # SET one column WHERE id
    assert {r: api(r) for r in repo_ids} == before
    assert (
        TemplateVersion.objects.count(),
        TemplateSnapshot.objects.count(),
        TemplateChange.objects.count(),
    ) == counts


def test_a_first_sync_writes_under_the_model_lock_without_savepoints(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    """A new repo whose template is already known: its snapshot and change are read then
    created under the model's row lock (no get_or_create savepoints, two queries each); only a
    new template version, shared by every model, keeps its savepoint."""
    upload(fake_hub, "org/known", {"tokenizer_config.json": tc(CHATML)})
    upload(fake_hub, "org/same", {"tokenizer_config.json": tc(CHATML)})
    first, _ = HubModel.objects.track("org/known", via="track")
    syncer.sync(first)
    model, _ = HubModel.objects.track("org/same", via="track")
    with CaptureQueriesContext(connection) as queries:
        result = syncer.sync(model)
    assert (result.outcome, result.changes) == ("updated", 1)
    sql = [q["sql"] for q in queries]
    # One: the sync's own transaction, nested in the test's (get_or_create added two more).
    assert len([q for q in sql if q.startswith("SAVEPOINT")]) == 1, sql
    inserts = sorted(q.split('"')[1] for q in sql if q.startswith("INSERT"))
    assert inserts == [
        "registry_outboxmessage",
        "registry_templatechange",
        "registry_templatesnapshot",
    ]
    assert TemplateVersion.objects.count() == 1
    # Nor does it look for stale fixes: it is neither cache-safe nor a lagging copy of a base.
    assert not [q for q in sql if "'older'" in q], sql
    assert len(sql) <= 11, sql  # 16 before both


def test_forced_resync_rereads_history_and_adds_no_rows(
    corpus_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    sync("CohereForAI/c4ai-command-r-v01")
    rows = (TemplateChange.objects.count(), TemplateSnapshot.objects.count())
    assert sync("CohereForAI/c4ai-command-r-v01", force=True).changes == 0
    assert (TemplateChange.objects.count(), TemplateSnapshot.objects.count()) == rows


# --- where the template comes from ------------------------------------------------------------


def test_named_templates_from_a_tokenizer_config_list(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    named = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": TOOLS}]
    upload(fake_hub, "org/named", {"tokenizer_config.json": tc(named)})
    sync("org/named")
    template = api("org/named")["template"]
    assert template["source_file"] == "tokenizer_config.json"
    assert template["sha256"] == sha(CHATML)
    assert template["named_templates"] == {"default": sha(CHATML), "tool_use": sha(TOOLS)}
    assert template["special_tokens"] == {"bos_token": "<s>", "eos_token": "</s>"}


def test_named_templates_without_a_default(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """No `default` among the named templates: transformers renders a request without tools only
    when the caller names one. The API gives no template as the model's, only the named ones; the
    snapshot still files the first by name, so a repo synced before reads the same as now."""
    named = [{"name": "tool_use", "template": TOOLS}, {"name": "rag", "template": CHATML}]
    upload(fake_hub, "org/no-default", {"tokenizer_config.json": tc(named)})
    sync("org/no-default")
    template = api("org/no-default")["template"]
    assert template["sha256"] is None
    assert template["named_templates"] == {"rag": sha(CHATML), "tool_use": sha(TOOLS)}
    snapshot = HubModel.objects.get(repo_id="org/no-default").current_snapshot
    assert snapshot is not None and snapshot.default_template.sha256 == sha(CHATML)
    fake_hub.store.add_commit(
        "org/no-default", {"special_tokens_map.json": b'{"eos_token": "</s>"}'}, "tokens"
    )
    assert sync("org/no-default").changes == 0
    # A lone named template is no default either (transformers keeps it by its name).
    lone = [{"name": "tool_use", "template": TOOLS}]
    upload(fake_hub, "org/lone", {"tokenizer_config.json": tc(lone)})
    sync("org/lone")
    template = api("org/lone")["template"]
    assert (template["sha256"], template["named_templates"]) == (None, {"tool_use": sha(TOOLS)})


def test_chat_template_jinja_and_additional_templates_win_over_tokenizer_config(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(
        fake_hub,
        "org/jinja",
        {
            "tokenizer_config.json": tc("{{ 'ignored' }}"),
            "chat_template.jinja": CHATML,
            "additional_chat_templates/tool_use.jinja": TOOLS,
        },
    )
    sync("org/jinja")
    template = api("org/jinja")["template"]
    assert template["source_file"] == "chat_template.jinja"
    assert template["sha256"] == sha(CHATML)
    assert template["named_templates"] == {"default": sha(CHATML), "tool_use": sha(TOOLS)}
    # The tokens still come from tokenizer_config.json.
    assert template["special_tokens"]["eos_token"] == "</s>"


def test_legacy_chat_template_json_is_the_last_resort(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(
        fake_hub,
        "org/processor",
        {"tokenizer_config.json": tc(), "chat_template.json": json.dumps({"chat_template": TOOLS})},
    )
    sync("org/processor")
    assert api("org/processor")["template"]["source_file"] == "chat_template.json"
    assert api("org/processor")["template"]["sha256"] == sha(TOOLS)


def test_moving_the_template_to_chat_template_jinja_is_not_a_change(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/moved", {"tokenizer_config.json": tc(CHATML)})
    fake_hub.store.add_commit(
        "org/moved", {"tokenizer_config.json": tc(), "chat_template.jinja": CHATML}, "Move"
    )
    sync("org/moved")
    shown = api("org/moved")
    assert shown["template"]["source_file"] == "chat_template.jinja"
    assert len(shown["history"]) == 1


# --- statuses ---------------------------------------------------------------------------------


def test_repo_without_any_template_is_no_template(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/base-model", {"tokenizer_config.json": tc(), "config.json": b"{}"})
    assert sync("org/base-model").status == ModelStatus.NO_TEMPLATE
    assert api("org/base-model")["template"] is None


def test_unknown_repo_is_missing(fake_hub: FakeHub, sync: Callable[..., SyncResult]) -> None:
    result = sync("org/does-not-exist")
    assert result.status == ModelStatus.MISSING
    assert "404" in api("org/does-not-exist")["status_reason"]


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({"tokenizer_config.json": b'{"chat_template": "{{ x }}",'}, "not valid JSON"),
        ({"tokenizer_config.json": tc({"template": CHATML})}, "must be a string or a named list"),
        ({"tokenizer_config.json": tc(42)}, "got int"),
        ({"chat_template.jinja": b"{{ bos_token }}\xff\xfe"}, "not valid UTF-8"),
        ({"chat_template.jinja": CHATML + " " * 2_000_000}, "over the 1,048,576-byte cap"),
        ({"tokenizer_config.json": b"[1, 2]"}, "not a JSON object"),
        ({"tokenizer_config.json": b'{"chat_template": "{{ x }}\\ud800"}'}, "lone surrogate"),
        # Python reads no integer of more than 4,300 digits (a ValueError, not a JSON error).
        (
            {"tokenizer_config.json": b'{"chat_template": "x", "n": ' + b"9" * 5000 + b"}"},
            "not valid JSON here",
        ),
        ({"tokenizer_config.json": tc("{{ x }}\u0000")}, "NUL character"),
        # Two names the catalog's column (100 characters) would cut to one.
        (
            {
                "tokenizer_config.json": tc(
                    [
                        {"name": "n" * 150 + "1", "template": CHATML},
                        {"name": "n" * 150 + "2", "template": TOOLS},
                    ]
                )
            },
            "1 to 100 characters",
        ),
        (
            {
                "tokenizer_config.json": tc(
                    [
                        {"name": "\ud800", "template": CHATML},
                        {"name": "tool_use", "template": TOOLS},
                    ]
                )
            },
            "a template name holds a lone surrogate",
        ),
        (
            {
                "tokenizer_config.json": tc(
                    [
                        {"name": "a\u0000b", "template": CHATML},
                        {"name": "tool_use", "template": TOOLS},
                    ]
                )
            },
            "a template name holds a NUL",
        ),
        (
            {
                "chat_template.jinja": CHATML,
                "additional_chat_templates/" + "t" * 120 + ".jinja": TOOLS,
            },
            "1 to 100 characters",
        ),
        ({"tokenizer_config.json": tc(CHATML, eos_token="</s>\u0000")}, "eos_token holds a NUL"),
    ],
    ids=[
        "malformed-json",
        "template-object",
        "template-number",
        "bad-utf8",
        "huge",
        "json-list",
        "lone-surrogate",
        "huge-integer",
        "nul-in-template",
        "long-names",
        "surrogate-name",
        "nul-in-name",
        "long-file-name",
        "nul-in-token",
    ],
)
def test_hostile_files_make_the_repo_broken_with_a_reason(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], files: dict[str, Any], reason: str
) -> None:
    upload(fake_hub, "org/hostile", files)
    assert sync("org/hostile").status == ModelStatus.BROKEN
    shown = api("org/hostile")
    assert reason in shown["status_reason"]
    assert not TemplateSnapshot.objects.exists()
    # Nothing readable to check: the verdict says so with the reason instead of staying pending.
    assert shown["verdict"] == "error"
    assert reason in HubModel.objects.get(repo_id="org/hostile").verdict_summary


def test_broken_upstream_keeps_the_last_good_template_and_recovers(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/flaky", {"tokenizer_config.json": tc(CHATML)})
    sync("org/flaky")
    fake_hub.store.add_commit("org/flaky", {"tokenizer_config.json": b"{oops"}, "Break it")
    assert sync("org/flaky").status == ModelStatus.BROKEN
    assert api("org/flaky")["template"]["sha256"] == sha(CHATML)
    fixed = fake_hub.store.add_commit("org/flaky", {"tokenizer_config.json": tc(TOOLS)}, "Fix")
    assert sync("org/flaky").status == ModelStatus.OK
    assert api("org/flaky")["history"][0]["commit"] == fixed.sha


def test_gated_repo_keeps_its_last_templates_until_access_is_granted(
    fake_hub: FakeHub, hub_settings: Any, sleeps: Sleeps, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/gated", {"tokenizer_config.json": tc(CHATML), "config.json": b"{}"})
    sync("org/gated")
    fake_hub.store.set("org/gated", gated="manual")
    changed = fake_hub.store.add_commit("org/gated", {"tokenizer_config.json": tc(TOOLS)}, "New")
    assert sync("org/gated").status == ModelStatus.GATED
    assert sync("org/gated").status == ModelStatus.GATED  # still gated: no second event
    events = ModelEvent.objects.filter(kind=EventKind.STATUS_CHANGED)
    assert [(e.data["old"], e.data["new"]) for e in events] == [("ok", "gated")]
    shown = api("org/gated")
    assert shown["template"]["sha256"] == sha(CHATML)
    assert len(shown["history"]) == 1
    # With a token that was granted access, the sync picks up what happened meanwhile.
    fake_hub.store.set("org/gated", allowed_tokens={"hf_granted"})
    hub_settings.HF_TOKEN = "hf_granted"
    model = HubModel.objects.get(repo_id="org/gated")
    assert (
        RegistrySync(HubClient(sleep=sleeps, clock=sleeps.clock)).sync(model).status
        == ModelStatus.OK
    )
    assert api("org/gated")["history"][0]["commit"] == changed.sha


def test_private_and_disabled_repos_keep_their_templates(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/private", {"tokenizer_config.json": tc(CHATML)})
    upload(fake_hub, "org/disabled", {"tokenizer_config.json": tc(CHATML)})
    sync("org/private")
    sync("org/disabled")
    fake_hub.store.set("org/private", private=True)
    fake_hub.store.set("org/disabled", disabled=True)
    assert sync("org/private").status == ModelStatus.PRIVATE
    assert sync("org/disabled").status == ModelStatus.DISABLED
    assert api("org/private")["template"]["sha256"] == sha(CHATML)
    assert api("org/disabled")["template"]["sha256"] == sha(CHATML)


def test_deleted_repo_becomes_missing_and_keeps_its_history(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/deleted", {"tokenizer_config.json": tc(CHATML)})
    sync("org/deleted")
    fake_hub.store.remove("org/deleted")
    assert sync("org/deleted").status == ModelStatus.MISSING
    assert len(api("org/deleted")["history"]) == 1


# --- faults -----------------------------------------------------------------------------------


def test_429_waits_what_the_hub_says_then_succeeds(
    fake_hub: FakeHub, sleeps: Sleeps, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/limited", {"tokenizer_config.json": tc(CHATML)})
    fake_hub.inject("429", times=1, match="/api/models/org/limited", retry_after=7)
    fake_hub.inject("429", times=1, match="/resolve/", retry_after=3)
    assert sync("org/limited").status == ModelStatus.OK
    assert sleeps == [8.0, 4.0]  # Retry-After + 1 s, like huggingface_hub itself


def test_500s_are_retried_with_backoff(
    fake_hub: FakeHub, sleeps: Sleeps, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/shaky", {"tokenizer_config.json": tc(CHATML)})
    fake_hub.inject("500", times=2, match="/tree/")
    assert sync("org/shaky").status == ModelStatus.OK
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.9 / 1.5 and all(s > 0 for s in sleeps)
    statuses = [r.status for r in fake_hub.requests("org/shaky") if "/tree/" in r.path]
    assert statuses[:3] == [500, 500, 200]


def test_hub_down_leaves_everything_as_it_was(
    fake_hub: FakeHub, sleeps: Sleeps, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/down", {"tokenizer_config.json": tc(CHATML)})
    fake_hub.inject("500", times=100, match="/resolve/")
    with pytest.raises(HubUnavailable, match="after 5 attempts"):
        sync("org/down")
    model = HubModel.objects.get(repo_id="org/down")
    assert model.status == ModelStatus.PENDING
    assert "500" in model.sync_error
    assert not TemplateVersion.objects.exists() and not TemplateChange.objects.exists()
    assert len(sleeps) == 4


def test_truncated_and_slow_answers_are_retried(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/cut", {"chat_template.jinja": TOOLS, "tokenizer_config.json": tc()})
    fake_hub.inject("truncated", times=1, match="chat_template.jinja")
    fake_hub.inject("truncated", times=1, match="/api/models/org/cut")
    fake_hub.inject("slow", times=1, match="/commits/", delay=3)  # the client waits 2 s
    assert sync("org/cut").status == ModelStatus.OK
    assert api("org/cut")["template"]["sha256"] == sha(TOOLS)


def test_interrupted_sync_writes_no_partial_rows(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    named = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": TOOLS}]
    upload(fake_hub, "org/interrupted", {"tokenizer_config.json": tc(named)})

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("worker killed")

    monkeypatch.setattr(NamedTemplate.objects, "bulk_create", crash)
    with pytest.raises(RuntimeError):
        sync("org/interrupted")
    assert not TemplateVersion.objects.exists()
    assert not TemplateSnapshot.objects.exists() and not TemplateChange.objects.exists()
    assert HubModel.objects.get(repo_id="org/interrupted").template_files == {}
    monkeypatch.undo()
    assert sync("org/interrupted").changes == 1


def test_every_file_of_one_sync_comes_from_one_pinned_commit(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    files = upload_files("org/pinned", CHATML.encode(), "<s>", "</s>", as_jinja=True)
    head = upload(fake_hub, "org/pinned", files)
    sync("org/pinned")
    downloads = [r.path for r in fake_hub.requests("org/pinned") if "/resolve/" in r.path]
    assert downloads and all(f"/resolve/{head}/" in p for p in downloads)
    assert not any(p.endswith("tokenizer.json") for p in downloads)  # only a pointer


def test_a_template_that_is_removed_is_a_change_to_nothing(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/removed", {"tokenizer_config.json": tc(CHATML)})
    sync("org/removed")
    fake_hub.store.add_commit("org/removed", {"tokenizer_config.json": tc()}, "Drop template")
    assert sync("org/removed").status == ModelStatus.NO_TEMPLATE
    latest = api("org/removed")["history"][0]
    assert (latest["template_sha256"], latest["previous_sha256"]) == (None, sha(CHATML))


def test_named_template_changes_alone_are_changes_too(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    def named(tool_text: str) -> bytes:
        return tc(
            [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": tool_text}]
        )

    upload(fake_hub, "org/tools", {"tokenizer_config.json": named(TOOLS)})
    sync("org/tools")
    fake_hub.store.add_commit("org/tools", {"tokenizer_config.json": named(TOOLS + " ")}, "tools")
    assert sync("org/tools").changes == 1
    assert api("org/tools")["template"]["named_templates"]["tool_use"] == sha(TOOLS + " ")


def test_corpus_tokenizer_config_helper_round_trips() -> None:
    # The fake Hub's files are what the tests say they are.
    raw = tokenizer_config(CHATML.encode(), "<s>", "</s>")
    assert json.loads(raw)["chat_template"] == CHATML


def test_a_bare_bones_hub_without_sha_or_error_codes_still_syncs(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """Model info without `sha` or file metadata, errors without X-Error-Code: the statuses
    come from the HTTP codes (a bare 404 once it lasts) and the head from the commit list."""
    fake_hub.state.minimal = True
    head = upload(fake_hub, "org/plain", {"tokenizer_config.json": tc(CHATML)})
    upload(fake_hub, "org/plain-gated", {"tokenizer_config.json": tc(CHATML)}, gated="auto")
    upload(fake_hub, "org/plain-private", {"tokenizer_config.json": tc(CHATML)}, private=True)
    assert sync("org/plain").status == ModelStatus.OK
    assert api("org/plain")["last_commit_sha"] == head
    assert api("org/plain")["template"]["tokenizer_json"] is None
    assert sync("org/plain-gated").status == ModelStatus.GATED
    assert sync("org/plain-private").status == ModelStatus.PRIVATE
    with pytest.raises(HubUnavailable, match="404"):
        sync("org/plain-missing")
    HubModel.objects.filter(repo_id="org/plain-missing").update(
        not_found_since=timezone.now() - MISSING_AFTER
    )
    assert sync("org/plain-missing").status == ModelStatus.MISSING
    assert sync("org/plain").outcome == "unchanged"


def test_a_bare_404_on_a_file_is_retried_later_not_a_missing_repo(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "org/cdn-hiccup", {"tokenizer_config.json": tc(CHATML)})
    fake_hub.inject("404", times=1, match="/resolve/")
    with pytest.raises(HubUnavailable, match="404"):
        sync("org/cdn-hiccup")
    assert HubModel.objects.get(repo_id="org/cdn-hiccup").status == ModelStatus.PENDING
    assert sync("org/cdn-hiccup").status == ModelStatus.OK


def test_a_bare_404_on_model_info_is_retried_later_not_a_missing_repo(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """A 404 without the Hub's `X-Error-Code: RepoNotFound` can come from a proxy, a load
    balancer or a Hub hiccup: the repo stays as it was, no subscriber hears it is gone."""
    upload(fake_hub, "org/hiccup", {"tokenizer_config.json": tc(CHATML)})
    assert sync("org/hiccup").status == ModelStatus.OK
    fake_hub.inject("404", times=1, match="/api/models/org/hiccup")
    with pytest.raises(HubUnavailable, match="404"):
        sync("org/hiccup")
    model = HubModel.objects.get(repo_id="org/hiccup")
    assert model.status == ModelStatus.OK and "404" in model.sync_error
    assert api("org/hiccup")["template"]["sha256"] == sha(CHATML)
    assert not ModelEvent.objects.filter(kind=EventKind.STATUS_CHANGED).exists()
    assert sync("org/hiccup").outcome == "unchanged"
    model = HubModel.objects.get(repo_id="org/hiccup")
    assert (model.sync_error, model.not_found_since) == ("", None)


def test_a_bare_404_that_lasts_a_day_marks_the_repo_missing(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """A Hub look-alike that sends no error codes: a repo deleted there answers bare 404s, and
    is missing once they have lasted `MISSING_AFTER`, counted from the first."""
    upload(fake_hub, "org/gone", {"tokenizer_config.json": tc(CHATML)})
    assert sync("org/gone").status == ModelStatus.OK
    fake_hub.state.minimal = True
    fake_hub.store.remove("org/gone")
    with pytest.raises(HubUnavailable, match="404"):
        sync("org/gone")
    first = HubModel.objects.get(repo_id="org/gone").not_found_since
    assert first is not None
    with pytest.raises(HubUnavailable, match="404"):
        sync("org/gone")
    model = HubModel.objects.get(repo_id="org/gone")
    assert model.status == ModelStatus.OK and "404" in model.sync_error
    assert model.not_found_since == first  # counted from the first
    assert not ModelEvent.objects.filter(kind=EventKind.STATUS_CHANGED).exists()
    HubModel.objects.filter(pk=model.pk).update(not_found_since=first - MISSING_AFTER)
    result = sync("org/gone")
    assert result.status == ModelStatus.MISSING and "(404)" in result.message
    [event] = ModelEvent.objects.filter(kind=EventKind.STATUS_CHANGED)
    assert "ok → missing" in event.summary
    assert api("org/gone")["template"]["sha256"] == sha(CHATML)  # the last known, kept


def test_a_new_repo_is_read_head_first_in_two_requests_then_its_history(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    upload(fake_hub, "org/head", {"tokenizer_config.json": tc(CHATML), "config.json": b"{}"})
    fake_hub.store.add_commit("org/head", {"tokenizer_config.json": tc(TOOLS)}, "Add tools")
    repo = fake_hub.store.get("org/head")
    assert repo is not None
    model, _ = HubModel.objects.track("org/head", via="track")
    fake_hub.reset_log()
    assert syncer.sync(model).status == ModelStatus.OK
    # Model info (its siblings stand in for the head's tree), then the template file: the
    # verdict can start. config.json, the commits and the older trees wait for the backfill.
    assert [r.path for r in fake_hub.requests("org/head")] == [
        "/api/models/org/head",
        f"/org/head/resolve/{repo.head.sha}/tokenizer_config.json",
    ]
    model.refresh_from_db()
    assert model.history_from == repo.head.sha and model.history_complete is False
    first = TemplateChange.objects.get(model=model)
    assert first.old_version is None and not first.backfilled  # announced: a new template

    fake_hub.reset_log()
    assert syncer.backfill(model).changes == 1
    model.refresh_from_db()
    assert model.history_from == "" and model.history_complete is True
    changes = list(TemplateChange.objects.filter(model=model).order_by("committed_at"))
    # The upload brought CHATML (found now, backfilled); the head's change is now CHATML →
    # TOOLS, as it really was.
    assert [c.commit_sha for c in changes] == [repo.commits[1].sha, repo.head.sha]
    assert changes[0].backfilled and changes[0].new_version is not None
    assert changes[0].new_version.text == CHATML
    assert changes[1].old_version == changes[0].new_version
    assert changes[1].title == "Add tools"
    backfill = [r.path for r in fake_hub.requests("org/head")]
    assert backfill[0].startswith("/api/models/org/head/commits/")
    # The two older commits' trees, the upload's template file, and config.json at the head
    # (seen in the first sync's model info: not listed again).
    assert sum("/tree/" in p for p in backfill) == 2
    assert [p.rsplit("/", 1)[-1] for p in backfill if "/resolve/" in p] == [
        "tokenizer_config.json",
        "config.json",
    ]
    # Backfilled changes are checked but not announced: no template event for them.
    claim_template_changes(ids=[c.pk for c in changes])
    assert set(ModelEvent.objects.values_list("data__change_id", flat=True)) == {changes[1].pk}


def test_a_head_that_kept_an_older_template_loses_its_first_template_change(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    upload(fake_hub, "org/kept", {"tokenizer_config.json": tc(CHATML)})
    fake_hub.store.add_commit("org/kept", {"README.md": "# card"}, "Update README.md")
    model, _ = HubModel.objects.track("org/kept", via="track")
    syncer.sync(model)
    model.refresh_from_db()
    syncer.backfill(model)
    repo = fake_hub.store.get("org/kept")
    assert repo is not None
    (change,) = TemplateChange.objects.filter(model=model)
    assert change.commit_sha == repo.commits[1].sha  # the upload, not the README commit
    assert HubModel.objects.get(pk=model.pk).last_template_change_at == repo.commits[1].date


def test_the_heads_files_come_from_model_info_unless_named_templates(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    # A folder of named templates has a tree id only a listing gives: the head is listed.
    upload(
        fake_hub,
        "org/named",
        {"tokenizer_config.json": tc(CHATML), "additional_chat_templates/tool_use.jinja": TOOLS},
    )
    fake_hub.reset_log()
    assert sync("org/named").status == ModelStatus.OK
    named = fake_hub.store.get("org/named")
    assert named is not None
    assert any(r.path.endswith(f"/tree/{named.head.sha}") for r in fake_hub.requests("org/named"))


def test_a_head_that_moved_before_the_backfill_keeps_both_changes(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    first = upload(fake_hub, "org/moved", {"tokenizer_config.json": tc(CHATML)})
    model, _ = HubModel.objects.track("org/moved", via="track")
    syncer.sync(model)  # head first, at `first`
    second = fake_hub.store.add_commit("org/moved", {"tokenizer_config.json": tc(TOOLS)}, "Tools")
    model.refresh_from_db()
    syncer.sync(model)  # the head moved: read from it back to `first`, announced as usual
    model.refresh_from_db()
    assert model.history_from == first
    syncer.backfill(model)  # from `first` back: nothing before it had a template
    model.refresh_from_db()
    assert model.history_from == "" and model.history_complete is True
    assert model.current_snapshot is not None
    assert model.current_snapshot.default_template.text == TOOLS
    changes = {c.commit_sha: c for c in TemplateChange.objects.filter(model=model)}
    assert set(changes) == {first, second.sha}
    assert changes[first].old_version is None and not changes[first].backfilled
    assert changes[second.sha].old_version == changes[first].new_version


def test_a_change_dated_in_the_future_counts_as_found_when_synced(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """The catalog's last template change (and its sort) took the commit's date as its author
    set it: a commit dated 2099 stayed at the top."""
    from dataclasses import replace
    from datetime import UTC, datetime

    upload(fake_hub, "acme/future", {"tokenizer_config.json": tc("{{ messages }}")})
    sync("acme/future")
    commit = fake_hub.store.add_commit("acme/future", {"tokenizer_config.json": tc("{{ x }}")})
    repo = fake_hub.store.get("acme/future")
    assert repo is not None
    repo.commits[-1] = replace(commit, date=datetime(2099, 1, 1, tzinfo=UTC))
    before = timezone.now()
    sync("acme/future")
    model = HubModel.objects.get(repo_id="acme/future")
    change = model.changes.get(commit_sha=commit.sha)
    assert change.committed_at is not None and change.committed_at.year == 2099  # as the Hub says
    assert model.last_template_change_at is not None
    assert before <= model.last_template_change_at <= timezone.now()


# --- histories that do not reach the commit a sync read -----------------------------------------


def test_more_new_commits_than_the_window_announce_no_unchanged_template(
    fake_hub: FakeHub, hub_settings: Any, sync: Callable[..., SyncResult], syncer: RegistrySync
) -> None:
    """A repo that pushed more commits than the history window since the last sync (a run of
    checkpoints): the commit read last is not reached, and the oldest commit in the window was
    compared with nothing, so an unchanged template was recorded and announced as "added"."""
    hub_settings.REGISTRY_HISTORY_LIMIT = 5
    upload(fake_hub, "org/busy", {"tokenizer_config.json": tc(CHATML)})
    sync("org/busy")
    model = HubModel.objects.get(repo_id="org/busy")
    claim_template_changes()
    changes = TemplateChange.objects.filter(model=model).count()
    events = ModelEvent.objects.filter(model=model, kind=EventKind.TEMPLATE_CHANGED).count()
    for n in range(8):
        fake_hub.store.add_commit("org/busy", {"README.md": f"checkpoint {n}"}, f"step {n}")
    result = syncer.sync(HubModel.objects.get(pk=model.pk))
    claim_template_changes()
    assert result.changes == 0
    assert TemplateChange.objects.filter(model=model).count() == changes
    assert ModelEvent.objects.filter(model=model, kind=EventKind.TEMPLATE_CHANGED).count() == events
    assert api("org/busy")["history_complete"] is False  # the gap is said, not hidden

    # A template changed in the gap: one change, from the template the last sync read.
    fake_hub.store.add_commit("org/busy", {"tokenizer_config.json": tc(TOOLS)}, "tools")
    for n in range(8):
        fake_hub.store.add_commit("org/busy", {"README.md": f"more {n}"}, f"more {n}")
    assert syncer.sync(HubModel.objects.get(pk=model.pk)).changes == 1
    [latest] = api("org/busy")["history"][:1]
    assert latest["previous_sha256"] == sha(CHATML)
    assert latest["template_sha256"] == sha(TOOLS)


def test_a_squashed_history_announces_only_a_changed_template(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], syncer: RegistrySync
) -> None:
    """`super_squash_history` replaces every commit with one: the commit read last is gone."""
    upload(fake_hub, "org/squashed", {"tokenizer_config.json": tc(CHATML)})
    sync("org/squashed")
    model = HubModel.objects.get(repo_id="org/squashed")
    changes = TemplateChange.objects.filter(model=model).count()
    head = fake_hub.store.squash("org/squashed")
    assert syncer.sync(HubModel.objects.get(pk=model.pk)).changes == 0
    assert TemplateChange.objects.filter(model=model).count() == changes
    assert api("org/squashed")["last_commit_sha"] == head.sha

    fake_hub.store.add_commit("org/squashed", {"tokenizer_config.json": tc(TOOLS)}, "tools")
    fake_hub.store.squash("org/squashed")
    assert syncer.sync(HubModel.objects.get(pk=model.pk)).changes == 1
    [latest] = api("org/squashed")["history"][:1]
    assert (latest["previous_sha256"], latest["template_sha256"]) == (sha(CHATML), sha(TOOLS))


def test_a_backfill_whose_start_was_squashed_away_gives_up_once(
    fake_hub: FakeHub, hub_settings: Any, syncer: RegistrySync
) -> None:
    """The head a first sync read alone is gone before its backfill (a squashed history): the
    backfill asked for it at every run, for ever, ahead of the repos queued after it."""
    upload(fake_hub, "org/gone", {"tokenizer_config.json": tc(CHATML)})
    model, _ = HubModel.objects.track("org/gone", via="track")
    syncer.sync(model)
    model.refresh_from_db()
    assert model.history_from
    fake_hub.store.squash("org/gone")
    [result] = backfill_histories(100, client=syncer.client)
    assert (result.outcome, result.changes) == ("updated", 0)
    assert backfill_histories(100, client=syncer.client) == []  # nothing left waiting
    model.refresh_from_db()
    assert (model.history_from, model.history_complete) == ("", False)
    assert (model.status, model.sync_error) == (ModelStatus.OK, "")
    asked = [r.path for r in fake_hub.requests("org/gone") if "/commits/" in r.path]
    assert len(asked) == 1  # once, not at every run
