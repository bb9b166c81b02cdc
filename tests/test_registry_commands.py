"""Management commands: track, sync_hub, import_local, watch (one through a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from registry.api import model_json
from registry.models import HubModel, ModelStatus, TemplateChange, Watch
from tests.conftest import REPO_ROOT
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import corpus_hub, fake_hub, hub_settings

pytestmark = pytest.mark.django_db
__all__ = ["corpus_hub", "fake_hub", "hub_settings"]

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=out)
    return out.getvalue()


def test_track_then_sync_hub_fills_in_the_models(corpus_hub: FakeHub, hub_settings: Any) -> None:
    out = run("track", "Qwen/Qwen3-0.6B", "CohereForAI/c4ai-command-r-v01")
    assert out.splitlines() == [
        "Qwen/Qwen3-0.6B: tracked",
        "CohereForAI/c4ai-command-r-v01: tracked",
    ]
    assert run("track", "Qwen/Qwen3-0.6B").strip() == "Qwen/Qwen3-0.6B: already tracked"
    out = run("sync_hub")
    assert "Qwen/Qwen3-0.6B: ok, 1 template change(s) recorded" in out
    assert "CohereForAI/c4ai-command-r-v01: ok, 2 template change(s) recorded" in out
    assert "synced 2 repo(s)" in out
    assert "(unchanged)" in run("sync_hub", "Qwen/Qwen3-0.6B")


def test_sync_hub_tracks_repos_it_is_given(corpus_hub: FakeHub, hub_settings: Any) -> None:
    run("sync_hub", "Qwen/QwQ-32B")
    assert HubModel.objects.get(repo_id="Qwen/QwQ-32B").status == ModelStatus.OK


def test_commands_refuse_bad_ids_in_one_line(hub_settings: Any) -> None:
    for command in ("track", "sync_hub"):
        with pytest.raises(CommandError, match="'not/a/repo' is not a Hub model id"):
            run(command, "not/a/repo")
    assert not HubModel.objects.exists()


def test_sync_hub_fails_loudly_when_the_hub_is_down(
    fake_hub: FakeHub, hub_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_settings.HF_MAX_ATTEMPTS = 1
    fake_hub.inject("500", times=10)
    with pytest.raises(CommandError, match="1 of 1 repo\\(s\\) could not be synced"):
        run("sync_hub", "acme/anything")
    assert HubModel.objects.get(repo_id="acme/anything").status == ModelStatus.PENDING


def write_repo(root: Path, repo_id: str, files: dict[str, bytes]) -> None:
    folder = root / repo_id
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def test_import_local_reads_hub_layout_folders_once(tmp_path: Path) -> None:
    write_repo(
        tmp_path,
        "acme/offline-7b",
        {
            "tokenizer_config.json": tokenizer_config(TEMPLATE.encode(), "<s>", "</s>"),
            "config.json": json.dumps({"model_type": "lfm2", "architectures": ["X"]}).encode(),
            "tokenizer.json": b"{}",
        },
    )
    write_repo(
        tmp_path,
        "acme/jinja-3b",
        {"chat_template.jinja": TEMPLATE.encode() + b"\r\n", "tokenizer_config.json": b"{}"},
    )
    write_repo(tmp_path, "acme/broken", {"tokenizer_config.json": b'{"chat_template": 7}'})
    out = run("import_local", str(tmp_path))
    assert "imported 3 repo(s)" in out
    offline = model_json(HubModel.objects.get(repo_id="acme/offline-7b"))
    assert offline["status"] == "ok" and offline["is_hybrid"] is True
    assert offline["template"]["source_file"] == "tokenizer_config.json"
    assert offline["template"]["tokenizer_json"]["size"] == 2
    jinja = model_json(HubModel.objects.get(repo_id="acme/jinja-3b"))
    assert jinja["template"]["source_file"] == "chat_template.jinja"
    assert HubModel.objects.get(repo_id="acme/broken").status == ModelStatus.BROKEN
    changes = TemplateChange.objects.count()
    run("import_local", str(tmp_path))
    assert TemplateChange.objects.count() == changes == 2
    # A changed file is a new version on the next import.
    write_repo(tmp_path, "acme/jinja-3b", {"chat_template.jinja": TEMPLATE.encode()})
    run("import_local", str(tmp_path))
    assert len(model_json(HubModel.objects.get(repo_id="acme/jinja-3b"))["history"]) == 2


def test_import_local_says_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="is not a folder"):
        run("import_local", str(tmp_path / "nope"))
    with pytest.raises(CommandError, match="no repo folders found"):
        run("import_local", str(tmp_path))


def test_watch_an_author_tracks_its_repos(corpus_hub: FakeHub, hub_settings: Any) -> None:
    out = run("watch", "--author", "Qwen", "--refresh")
    assert f"watch {Watch.objects.get().pk}: author Qwen (added)" in out
    qwen = {r.repo_id for r in corpus_hub.store.all() if r.author == "Qwen"}
    assert f"{len(qwen)} new repo(s) tracked" in out
    assert set(HubModel.objects.values_list("repo_id", flat=True)) == qwen
    assert "0 new repo(s) tracked" in run("watch", "--refresh")
    corpus_hub.store.create_repo("Qwen/Qwen4-1B")
    assert "1 new repo(s) tracked" in run("watch", "--refresh")


def test_watch_a_query_tracks_the_top_n(corpus_hub: FakeHub, hub_settings: Any) -> None:
    run("watch", "--pipeline-tag", "text-generation", "--limit", "5", "--refresh")
    top = sorted(corpus_hub.store.all(), key=lambda r: r.downloads, reverse=True)[:5]
    assert set(HubModel.objects.values_list("repo_id", flat=True)) == {r.repo_id for r in top}
    assert "top 5 by downloads text-generation" in run("watch")
    run("watch", "--remove", str(Watch.objects.get().pk))
    assert not Watch.objects.exists()
    with pytest.raises(CommandError, match="no watch 99"):
        run("watch", "--remove", "99")


def test_track_and_sync_hub_in_a_real_process_honour_hf_endpoint(
    corpus_hub: FakeHub, embedded_env: dict[str, str]
) -> None:
    env = {**embedded_env, "HF_ENDPOINT": corpus_hub.url, "HF_TOKEN": ""}

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    manage("migrate", "--verbosity", "0")
    manage("track", "Qwen/Qwen3.5-4B")
    out = manage("sync_hub")
    assert "Qwen/Qwen3.5-4B: ok, 1 template change(s) recorded" in out
    assert f"from {corpus_hub.url}" in out
    assert any(r.repo_id == "Qwen/Qwen3.5-4B" for r in corpus_hub.requests())
