"""GGUF repos against the fake Hub: the embedded template is the repo's, each file's header is
read by range requests only, and a bad header is a `broken` status, never a crash."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from registry.hub import HubClient
from registry.models import HubModel, ModelStatus, TemplateChange, TemplateVersion
from registry.sync import RegistrySync, SyncResult
from tests.fakehub import FakeHub
from tests.fakehub.fixtures import Sleeps, fake_hub, hub_settings, sleeps
from tests.gguf_files import gguf_bytes
from tests.test_registry_sync import sha, tc, upload

pytestmark = pytest.mark.django_db
__all__ = ["fake_hub", "hub_settings", "sleeps"]

OLD = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
NEW = OLD + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
#: What follows the header in a real file; a range reader never fetches it.
WEIGHTS = b"\x01" * (512 * 1024)


def gguf(template: str | None, **options: Any) -> bytes:
    return gguf_bytes(template, **options) + WEIGHTS


@pytest.fixture
def client(hub_settings: Any, sleeps: Sleeps) -> HubClient:
    return HubClient(sleep=sleeps, clock=sleeps.clock, timeout=5)


@pytest.fixture
def sync(client: HubClient) -> Callable[..., SyncResult]:
    def run(repo_id: str, **options: Any) -> SyncResult:
        model, _ = HubModel.objects.track(repo_id, via="track")
        return RegistrySync(client).sync(model, **options)

    return run


def kinds(hub: FakeHub, repo_id: str) -> list[str]:
    """The requests a sync made, by kind: info, gguf (expand), range, other."""
    found = []
    for entry in hub.requests(repo_id):
        if "/resolve/" in entry.path:
            found.append("range")
        elif entry.path.endswith(repo_id):
            found.append("info")
        else:
            found.append(entry.path)
    return found


def test_a_gguf_repo_takes_the_template_its_files_embed_reading_headers_only(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], client: HubClient
) -> None:
    upload(
        fake_hub,
        "bartowski/Qwen3-8B-GGUF",
        {
            "Qwen3-8B-Q4_K_M.gguf": gguf(OLD),
            "Qwen3-8B-Q8_0.gguf": gguf(OLD),
            "Qwen3-8B-BF16-00001-of-00002.gguf": gguf(OLD),
            "Qwen3-8B-BF16-00002-of-00002.gguf": WEIGHTS,
            "mmproj-Qwen3-8B-f16.gguf": WEIGHTS,
            "README.md": "---\nbase_model: Qwen/Qwen3-8B\n---\n",
        },
        tags=["gguf", "conversational"],
        library_name=None,
        base_model="Qwen/Qwen3-8B",
    )
    fake_hub.reset_log()
    result = sync("bartowski/Qwen3-8B-GGUF")

    model = HubModel.objects.get(repo_id="bartowski/Qwen3-8B-GGUF")
    assert result.status == ModelStatus.OK, result.message
    assert model.format == "gguf"
    assert model.current_snapshot is not None
    assert model.current_snapshot.source_file == "gguf"
    assert model.current_snapshot.default_template.text == OLD
    assert model.current_snapshot.special_tokens == {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
    }
    assert model.model_type == "qwen3" and not model.is_hybrid
    listed = {e["path"]: e for e in model.gguf_files}
    # Projectors and later shards carry no template: not read, not listed.
    assert sorted(listed) == [
        "Qwen3-8B-BF16-00001-of-00002.gguf",
        "Qwen3-8B-Q4_K_M.gguf",
        "Qwen3-8B-Q8_0.gguf",
    ]
    assert {e["status"] for e in listed.values()} == {"ok"}
    assert {e["template"] for e in listed.values()} == {sha(OLD)}
    # One info request, one `expand=gguf`, one range request per file (a small header fits
    # the first range); the weights are never sent.
    assert kinds(fake_hub, "bartowski/Qwen3-8B-GGUF") == ["info"] + ["range"] * 3 + ["info"]
    sent = [e.sent for e in fake_hub.requests("bartowski/Qwen3-8B-GGUF") if "resolve" in e.path]
    header = len(gguf_bytes(OLD))
    assert all(size == header + min(len(WEIGHTS), 256 * 1024 - header) for size in sent)
    assert all(e["bytes"] == sent[0] for e in listed.values())
    assert client.bytes_read == sum(sent)

    # Nothing changed: one request, no header read again.
    fake_hub.reset_log()
    assert sync("bartowski/Qwen3-8B-GGUF").outcome == "unchanged"
    assert kinds(fake_hub, "bartowski/Qwen3-8B-GGUF") == ["info"]

    # A README edit moves the head but no GGUF file: no header read, no change; one byte of
    # the main file says the repo is still ours to read.
    fake_hub.store.add_commit("bartowski/Qwen3-8B-GGUF", {"README.md": "new card"}, "card")
    fake_hub.reset_log()
    assert sync("bartowski/Qwen3-8B-GGUF").outcome == "updated"
    assert kinds(fake_hub, "bartowski/Qwen3-8B-GGUF") == ["info", "range"]
    assert [e.sent for e in fake_hub.requests("bartowski/Qwen3-8B-GGUF")][-1] == 1
    assert TemplateChange.objects.filter(model=model).count() == 1

    # Gated since, with another such edit: model info still answers, the file does not.
    fake_hub.store.set("bartowski/Qwen3-8B-GGUF", gated="manual")
    fake_hub.store.add_commit("bartowski/Qwen3-8B-GGUF", {"README.md": "gated card"}, "gate")
    assert sync("bartowski/Qwen3-8B-GGUF").status == ModelStatus.GATED
    model.refresh_from_db()
    assert model.current_snapshot is not None  # its template and verdict are kept
    assert TemplateChange.objects.filter(model=model).count() == 1


def test_files_that_embed_different_templates_are_listed_and_a_new_file_is_a_change(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    repo = "unsloth/Qwen3-8B-GGUF"
    upload(fake_hub, repo, {"Qwen3-8B-Q4_K_M.gguf": gguf(OLD), "Qwen3-8B-Q8_0.gguf": gguf(OLD)})
    sync(repo)
    fake_hub.store.add_commit(repo, {"Qwen3-8B-Q4_K_M.gguf": gguf(NEW)}, "Fix chat template")
    fake_hub.reset_log()
    sync(repo)

    model = HubModel.objects.get(repo_id=repo)
    # Only the replaced file was read again.
    assert kinds(fake_hub, repo) == ["info", "range", "info"]
    by_path = {e["path"]: e["template"] for e in model.gguf_files}
    assert by_path == {"Qwen3-8B-Q4_K_M.gguf": sha(NEW), "Qwen3-8B-Q8_0.gguf": sha(OLD)}
    assert TemplateVersion.objects.filter(sha256=sha(NEW)).exists()
    # The Hub's main file (the first by name) now embeds NEW: that is the repo's template.
    assert model.current_snapshot is not None
    assert model.current_snapshot.default_template.text == NEW
    change = TemplateChange.objects.filter(model=model).latest("id")
    assert change.old_version is not None and change.old_version.text == OLD
    assert change.new_version is not None and change.new_version.text == NEW


def test_a_truncated_header_is_broken_with_the_reason_and_the_other_files_still_count(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    whole = gguf_bytes(OLD)
    upload(fake_hub, "a/cut-GGUF", {"model-Q4.gguf": whole[: len(whole) // 2]})
    upload(fake_hub, "a/half-GGUF", {"a-Q4.gguf": gguf(OLD), "b-Q8.gguf": whole[:40]})

    result = sync("a/cut-GGUF")
    assert result.status == ModelStatus.BROKEN
    model = HubModel.objects.get(repo_id="a/cut-GGUF")
    assert "model-Q4.gguf" in model.status_reason
    assert "truncated: the file ends at byte" in model.status_reason
    assert model.gguf_files[0]["status"] == "broken"

    assert sync("a/half-GGUF").status == ModelStatus.OK
    entries = {e["path"]: e for e in HubModel.objects.get(repo_id="a/half-GGUF").gguf_files}
    assert entries["a-Q4.gguf"]["status"] == "ok"
    assert entries["b-Q8.gguf"]["status"] == "broken"
    assert "truncated" in entries["b-Q8.gguf"]["reason"]


def test_a_header_over_the_cap_is_listed_broken_and_the_bytes_read_stay_under_it(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], settings: Any, client: HubClient
) -> None:
    settings.REGISTRY_GGUF_MAX_HEADER_BYTES = 64 * 1024
    tokens = [f"token-{i:05d}" for i in range(20_000)]  # about 400 KB of vocabulary
    upload(fake_hub, "big/vocab-GGUF", {"m.gguf": gguf(OLD, tokens=tokens)})
    # The Hub parsed the main file, so the repo still has its template and verdict; our own
    # read of the file stopped at the cap, and says so.
    assert sync("big/vocab-GGUF").status == ModelStatus.OK
    (entry,) = HubModel.objects.get(repo_id="big/vocab-GGUF").gguf_files
    assert entry["status"] == "broken"
    assert "runs past the first 65,536 bytes" in entry["reason"]
    assert client.bytes_read <= 64 * 1024


def test_files_past_the_per_repo_limit_are_listed_unread(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], settings: Any
) -> None:
    settings.REGISTRY_GGUF_MAX_FILES = 2
    upload(fake_hub, "many/quants-GGUF", {f"m-Q{i}.gguf": gguf(OLD) for i in range(2, 6)})
    sync("many/quants-GGUF")
    statuses = [e["status"] for e in HubModel.objects.get(repo_id="many/quants-GGUF").gguf_files]
    assert statuses == ["ok", "ok", "not_read", "not_read"]
    assert sum("resolve" in e.path for e in fake_hub.requests("many/quants-GGUF")) == 2


def test_a_gguf_architecture_with_recurrent_layers_is_hybrid(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "q/Qwen3-Next-GGUF", {"m.gguf": gguf(OLD, arch="qwen3next")})
    sync("q/Qwen3-Next-GGUF")
    model = HubModel.objects.get(repo_id="q/Qwen3-Next-GGUF")
    assert model.is_hybrid and model.model_type == "qwen3next"


def test_a_gated_gguf_repo_is_gated(fake_hub: FakeHub, sync: Callable[..., SyncResult]) -> None:
    upload(fake_hub, "g/gated-GGUF", {"m.gguf": gguf(OLD)}, gated="manual")
    assert sync("g/gated-GGUF").status == ModelStatus.GATED


def test_without_a_hub_summary_the_first_readable_file_decides(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    # The Hub shows nothing for a main file it cannot parse; the next file still counts.
    whole = gguf_bytes(NEW)
    upload(fake_hub, "s/summary-GGUF", {"a.gguf": whole[:30], "b.gguf": gguf(OLD)})
    assert sync("s/summary-GGUF").status == ModelStatus.OK
    model = HubModel.objects.get(repo_id="s/summary-GGUF")
    assert model.current_snapshot is not None
    assert model.current_snapshot.default_template.text == OLD


def test_a_gguf_derivative_stores_its_drift_from_the_base_both_ways(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    upload(fake_hub, "Qwen/Qwen3-8B", {"tokenizer_config.json": tc(OLD)})
    upload(fake_hub, "bartowski/Qwen3-8B-GGUF", {"m.gguf": gguf(OLD)}, base_model="Qwen/Qwen3-8B")
    upload(fake_hub, "edit/Qwen3-8B-GGUF", {"m.gguf": gguf(OLD + " ")}, base_model="Qwen/Qwen3-8B")
    sync("bartowski/Qwen3-8B-GGUF")  # before its base is tracked: nothing to compare with
    assert HubModel.objects.get(repo_id="bartowski/Qwen3-8B-GGUF").drift == ""
    sync("Qwen/Qwen3-8B")  # the base's sync fills in its derivatives
    sync("edit/Qwen3-8B-GGUF")
    drift = dict(HubModel.objects.values_list("repo_id", "drift"))
    assert drift == {
        "Qwen/Qwen3-8B": "",
        "bartowski/Qwen3-8B-GGUF": "same",
        "edit/Qwen3-8B-GGUF": "edited",
    }
    # The base fixes its template: the copy is now an older one of the base's.
    fake_hub.store.add_commit("Qwen/Qwen3-8B", {"tokenizer_config.json": tc(NEW)}, "Fix")
    sync("Qwen/Qwen3-8B")
    assert HubModel.objects.get(repo_id="bartowski/Qwen3-8B-GGUF").drift == "older"


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        # llama.cpp's named templates are keys `tokenizer.chat_template.<name>`: any length.
        ({"named": {"n" * 150 + "1": OLD, "n" * 150 + "2": NEW}}, "1 to 100 characters"),
        ({"named": {"tool\x00use": NEW}}, "a template name holds a NUL"),
    ],
)
def test_templates_a_gguf_embeds_that_the_catalog_cannot_store_make_it_broken(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], options: dict[str, Any], reason: str
) -> None:
    upload(fake_hub, "odd/names-GGUF", {"m-Q4.gguf": gguf(OLD, **options)})
    assert sync("odd/names-GGUF").status == ModelStatus.BROKEN
    model = HubModel.objects.get(repo_id="odd/names-GGUF")
    assert reason in model.status_reason
    assert model.current_snapshot is None
    assert [(e["path"], e["named"]) for e in model.gguf_files] == [("m-Q4.gguf", {})]


TOOLS = OLD + "{# tools #}"


def test_a_broken_gguf_repo_stays_broken_after_a_commit_that_changes_no_gguf_file(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """With no GGUF file changed, nothing is read again, and why the repo was broken was lost:
    it came back `ok` with a template its files no longer carry, or `no_template`."""
    upload(fake_hub, "u/flip-GGUF", {"m-Q4.gguf": gguf(OLD)})
    assert sync("u/flip-GGUF").status == ModelStatus.OK
    fake_hub.store.add_commit("u/flip-GGUF", {"m-Q4.gguf": gguf(NEW, named={"tool\x00use": NEW})})
    assert sync("u/flip-GGUF").status == ModelStatus.BROKEN
    whole = gguf_bytes(OLD)
    upload(fake_hub, "a/cut-GGUF", {"model-Q4.gguf": whole[: len(whole) // 2]})
    assert sync("a/cut-GGUF").status == ModelStatus.BROKEN
    for repo_id in ("u/flip-GGUF", "a/cut-GGUF"):
        reason = HubModel.objects.get(repo_id=repo_id).status_reason
        fake_hub.store.add_commit(repo_id, {"README.md": "a new card"}, "card")
        result = sync(repo_id)
        model = HubModel.objects.get(repo_id=repo_id)
        assert (result.status, model.status, model.status_reason) == (
            ModelStatus.BROKEN, ModelStatus.BROKEN, reason
        ), repo_id  # fmt: skip


def test_gguf_files_removed_then_restored_are_read_again(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """Removed, they stayed listed on the model; restored, they matched that stale list, were
    not read, and the repo kept tokenizer_config.json's template."""
    repo = "r/restored-GGUF"
    upload(fake_hub, repo, {"m-Q4.gguf": gguf(OLD), "tokenizer_config.json": tc(NEW)})
    sync(repo)
    fake_hub.store.add_commit(repo, {"m-Q4.gguf": None}, "remove gguf")
    sync(repo)
    model = HubModel.objects.get(repo_id=repo)
    assert model.gguf_files == []
    assert model.current_snapshot is not None
    assert model.current_snapshot.source_file == "tokenizer_config.json"
    fake_hub.store.add_commit(repo, {"m-Q4.gguf": gguf(OLD)}, "restore gguf")
    sync(repo)
    model.refresh_from_db()
    assert [e["path"] for e in model.gguf_files] == ["m-Q4.gguf"]
    assert model.current_snapshot is not None
    assert model.current_snapshot.source_file == "gguf"
    assert model.current_snapshot.default_template.text == OLD


def test_named_templates_stay_when_another_quantization_changes(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """The main file, not read again, lent its named templates to nobody: `tool_use` dropped
    out of the repo (and of its verdict), and a template change was recorded that was none."""
    repo = "n/named-GGUF"
    upload(fake_hub, repo, {"a-Q4.gguf": gguf(OLD, named={"tool_use": TOOLS}),
                            "b-Q8.gguf": gguf(OLD)})  # fmt: skip
    assert sync(repo).status == ModelStatus.OK
    model = HubModel.objects.get(repo_id=repo)
    assert model.current_snapshot is not None
    before = sorted(model.current_snapshot.named_templates.values_list("name", flat=True))
    assert before == ["default", "tool_use"]
    fake_hub.store.add_commit(repo, {"b-Q8.gguf": gguf(OLD, name="requant")}, "requant Q8")
    sync(repo)
    model.refresh_from_db()
    assert model.current_snapshot is not None
    assert sorted(model.current_snapshot.named_templates.values_list("name", flat=True)) == before
    assert TemplateChange.objects.filter(model=model).count() == 1


def test_an_architecture_the_catalog_cannot_store_is_left_out(
    fake_hub: FakeHub, sync: Callable[..., SyncResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Hub's GGUF summary is JSON: an architecture with a lone surrogate made every sync of
    the repo fail as it wrote, so it got no more template updates."""
    import tests.fakehub.server as server

    real = server.gguf_summary

    def odd(commit: Any) -> Any:
        summary = real(commit)
        if summary is not None:
            summary["architecture"] = "qwen3\ud800"
        return summary

    monkeypatch.setattr(server, "gguf_summary", odd)
    upload(fake_hub, "s/surrogate-GGUF", {"m-Q4.gguf": gguf(OLD)})
    result = sync("s/surrogate-GGUF")
    model = HubModel.objects.get(repo_id="s/surrogate-GGUF")
    assert (result.status, model.sync_error) == (ModelStatus.OK, "")
    assert model.model_type == "qwen3"  # the file's own, as the Hub's could not be taken


# --- drift kept by a sync that finds a repo unavailable ------------------------------------------


def test_a_gated_derivatives_new_base_model_refreshes_its_drift(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """A gated repo's model info stays public: the sync keeps its card's new `base_model`, but
    kept the drift against the old base, so the catalog and the API said "same" while the
    model page said it differs from every version of the new base."""
    base = "Qwen/Qwen3-8B"
    upload(fake_hub, base, {"tokenizer_config.json": tc(OLD)})
    upload(fake_hub, "other/base", {"tokenizer_config.json": tc(NEW)})
    upload(fake_hub, "mlx-community/x", {"tokenizer_config.json": tc(OLD)}, base_model=base)
    for repo in (base, "other/base", "mlx-community/x"):
        sync(repo)
    assert HubModel.objects.get(repo_id="mlx-community/x").drift == "same"
    fake_hub.store.set("mlx-community/x", base_model="other/base", gated="manual")
    fake_hub.store.add_commit("mlx-community/x", {"README.md": "card"}, "card")
    sync("mlx-community/x")
    model = HubModel.objects.get(repo_id="mlx-community/x")
    assert (model.status, model.base_model) == ("gated", "other/base")
    page = Client().get("/m/mlx-community/x/").content.decode()
    assert "differs from every version of other/base" in page
    assert model.drift == "edited"


def test_a_base_tracked_but_unreadable_makes_its_derivatives_drift_unknown(
    fake_hub: FakeHub, sync: Callable[..., SyncResult]
) -> None:
    """The base's first sync found it gated: a derivative that names it has a tracked base it
    cannot be compared with yet ("unknown", as its page says), not none ("")."""
    base = "Qwen/Qwen3-8B"
    upload(fake_hub, "bartowski/q-GGUF", {"m.gguf": gguf(OLD)}, base_model=base)
    upload(fake_hub, base, {"tokenizer_config.json": tc(OLD)}, gated="manual")
    sync("bartowski/q-GGUF")
    assert HubModel.objects.get(repo_id="bartowski/q-GGUF").drift == ""  # no tracked base yet
    sync(base)
    page = Client().get("/m/bartowski/q-GGUF/").content.decode()
    assert f"cannot compare its chat template with {base}" in page
    assert HubModel.objects.get(repo_id="bartowski/q-GGUF").drift == "unknown"
