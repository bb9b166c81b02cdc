"""Syncs recorded in batches (`record_many`): the same rows as one repo at a time, in a few
statements for the whole batch, one message for the batch's template changes, and a repo the
batch cannot record costs no other its sync."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from registry import sync as sync_module
from registry.models import HubModel, OutboxMessage, TemplateChange
from registry.sync import (
    Observation,
    RegistrySync,
    record,
    record_batch,
    record_many,
    sync_concurrently,
)
from tests.fakehub import FakeHub
from tests.fakehub.fixtures import fake_hub, hub_settings, sleeps
from tests.test_gguf_sync import gguf
from tests.test_registry_sync import CHATML, TOOLS, syncer, tc, upload

pytestmark = pytest.mark.django_db
__all__ = ["fake_hub", "hub_settings", "sleeps", "syncer"]

EDITED = CHATML + "{#- edited by the converter -#}"


def a_family(hub: FakeHub, org: str) -> list[str]:
    """Repos of every kind a first sync meets, in `org`: a base, a copy and an edit of its
    template (one a GGUF), a repo without a template, one whose template is unreadable, and a
    repo with named templates."""
    base = f"{org}/Base-8B"
    upload(hub, base, {"tokenizer_config.json": tc(CHATML)})
    upload(hub, f"{org}/Base-8B-GGUF", {"m.gguf": gguf(CHATML)}, base_model=base)
    upload(hub, f"{org}/Base-8B-edit", {"tokenizer_config.json": tc(EDITED)}, base_model=base)
    upload(hub, f"{org}/no-template", {"tokenizer_config.json": tc()})
    upload(hub, f"{org}/broken", {"tokenizer_config.json": b"{not json"})
    named = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": TOOLS}]
    upload(hub, f"{org}/named", {"tokenizer_config.json": tc(named)})
    return [f"{org}/{name}" for name in (
        "Base-8B-GGUF", "Base-8B", "Base-8B-edit", "no-template", "broken", "named",
    )]  # fmt: skip


def observe(syncer: RegistrySync, repo_ids: list[str]) -> list[tuple[int, Observation]]:
    observed = []
    for repo_id in repo_ids:
        model, _ = HubModel.objects.track(repo_id, via="track")
        found = syncer.look(model)
        assert isinstance(found, Observation), found
        observed.append((model.pk, found))
    return observed


def rows(org: str) -> dict[str, Any]:
    """What the catalog, the model pages and the checks read of `org`'s models, by name."""
    shown: dict[str, Any] = {}
    for model in HubModel.objects.filter(repo_id__startswith=f"{org}/"):
        snapshot = model.current_snapshot
        shown[model.repo_id.split("/", 1)[1]] = {
            "status": (model.status, model.status_reason),
            "verdict": (model.verdict, model.verdict_summary),
            "drift": model.drift,
            "format": model.format,
            "history_from": bool(model.history_from),
            "template": snapshot.default_template.sha256 if snapshot else None,
            "named": sorted(
                (n.name, n.version.sha256) for n in snapshot.named_templates.all()
            ) if snapshot else [],
            "changes": [
                (c.old_version_id is None, c.new_version.sha256 if c.new_version else None)
                for c in TemplateChange.objects.filter(model=model).order_by("pk")
            ],
        }  # fmt: skip
    return shown


def test_a_batch_records_what_one_repo_at_a_time_records(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    alone, together = a_family(fake_hub, "alone"), a_family(fake_hub, "together")
    one_by_one = [record(pk, found) for pk, found in observe(syncer, alone)]
    batched = record_many(observe(syncer, together))
    assert [(r.outcome, r.status, r.changes, r.message) for r in batched] == [
        (r.outcome, r.status, r.changes, r.message) for r in one_by_one
    ]
    assert rows("together") == rows("alone")
    # And what that is: the copy is the base's template, the edit is not, however the batch
    # was ordered (the GGUF copy came before its base).
    assert {name: row["drift"] for name, row in rows("together").items()} == {
        "Base-8B": "", "Base-8B-GGUF": "same", "Base-8B-edit": "edited",
        "no-template": "", "broken": "", "named": "",
    }  # fmt: skip
    assert rows("together")["broken"]["verdict"][0] == "error"
    assert len(rows("together")["named"]["named"]) == 2


def test_a_batch_takes_a_statement_a_repo_and_a_few_for_the_batch(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    repos = [f"org/m{n}" for n in range(12)]
    for n, repo_id in enumerate(repos):
        upload(fake_hub, repo_id, {"tokenizer_config.json": tc(CHATML + "{#" + str(n) + "#}")})
    observed = observe(syncer, repos)
    with CaptureQueriesContext(connection) as one:
        record_many(observed[:1])
    with CaptureQueriesContext(connection) as twelve:
        record_many(observed[1:])
    # Repo by repo it was 11 to 12 statements each; a batch adds one (its update) a repo.
    assert len(twelve) <= len(one) + 10
    assert len(one) <= 16


def test_a_batch_sends_one_message_for_its_template_changes(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    repos = [f"org/m{n}" for n in range(5)]
    for repo_id in repos:
        upload(fake_hub, repo_id, {"tokenizer_config.json": tc(CHATML)})
    observed = observe(syncer, repos)
    OutboxMessage.objects.all().delete()
    record_many(observed)
    [message] = OutboxMessage.objects.all()
    assert message.task == "workers.handle_template_changes"
    assert sorted(message.args[0]) == sorted(
        TemplateChange.objects.filter(model__repo_id__in=repos).values_list("pk", flat=True)
    )
    assert len(message.args[0]) == 5


def test_the_worker_claims_a_batch_of_changes_once(fake_hub: FakeHub, syncer: RegistrySync) -> None:
    from registry.tasks import handle_template_changes

    repos = [f"org/m{n}" for n in range(3)]
    for repo_id in repos:
        upload(fake_hub, repo_id, {"tokenizer_config.json": tc(CHATML)})
    record_many(observe(syncer, repos))
    [message] = OutboxMessage.objects.filter(task="workers.handle_template_changes")
    assert handle_template_changes(*message.args) == 3
    assert handle_template_changes(*message.args) == 0  # a redelivered message does nothing
    assert not TemplateChange.objects.filter(checks_claimed_at=None).exists()


def test_a_repo_untracked_while_the_batch_read_it_costs_the_others_nothing(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    repos = ["org/kept", "org/dropped", "org/also-kept"]
    for repo_id in repos:
        upload(fake_hub, repo_id, {"tokenizer_config.json": tc(CHATML)})
    observed = observe(syncer, repos)
    models = HubModel.objects.in_bulk([pk for pk, _ in observed])
    HubModel.objects.filter(repo_id="org/dropped").delete()
    results = record_batch([(models[pk], found) for pk, found in observed])
    assert [(r.repo_id, r.outcome) for r in results] == [
        ("org/kept", "updated"), ("org/also-kept", "updated"),
    ]  # fmt: skip
    assert set(HubModel.objects.values_list("repo_id", "status")) == {
        ("org/kept", "ok"), ("org/also-kept", "ok"),
    }  # fmt: skip
    with pytest.raises(HubModel.DoesNotExist):
        record_many(observed)  # together, it is all or nothing: the batch names the model


def test_a_model_read_twice_in_a_batch_is_recorded_once_then_found_unchanged(
    fake_hub: FakeHub, syncer: RegistrySync
) -> None:
    upload(fake_hub, "org/twice", {"tokenizer_config.json": tc(CHATML)})
    [(pk, found)] = observe(syncer, ["org/twice"])
    first, second = record_many([(pk, found), (pk, found)])
    assert (first.outcome, first.changes) == ("updated", 1)
    assert TemplateChange.objects.filter(model_id=pk).count() == 1
    assert second.changes == 0


def batches_recorded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch `sync_concurrently` records from now on."""
    sizes: list[int] = []

    def recording(observed: list[tuple[int, Observation]]) -> list[Any]:
        sizes.append(len(observed))
        return record_many_as_is(observed)

    record_many_as_is = sync_module.record_many
    monkeypatch.setattr(sync_module, "record_many", recording)
    return sizes


def test_a_fast_hub_fills_the_batch_and_a_slow_one_does_not_hold_verdicts_back(
    fake_hub: FakeHub, hub_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(6):
        upload(fake_hub, f"org/m{n}", {"tokenizer_config.json": tc(CHATML)})
    models = [HubModel.objects.track(f"org/m{n}", via="track")[0] for n in range(6)]
    sizes = batches_recorded(monkeypatch)
    assert [r.outcome for r in sync_concurrently(models[:3])] == ["updated"] * 3
    assert sizes == [3]  # read at once: one transaction
    # The Hub answers slowly (or its quota paces us): a repo read is recorded once it has
    # waited RECORD_WAIT_SECONDS, with what was read meanwhile, not at the batch's end.
    monkeypatch.setattr(sync_module, "RECORD_WAIT_SECONDS", 0.15)
    fake_hub.state.latency = 0.1  # two requests a repo: each repo takes 0.2 s or more
    sizes.clear()
    assert [r.outcome for r in sync_concurrently(models[3:])] == ["updated"] * 3
    assert sizes == [2, 1]


def test_a_repo_that_fails_as_no_sync_expects_is_noted_and_the_run_goes_on(
    fake_hub: FakeHub, hub_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_repo_fails(fake_hub, monkeypatch, concurrency=1)


def one_repo_fails(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, concurrency: int) -> None:
    """One repo's sync raising what no sync expects (a bug, input nothing checks yet), in
    reading or in recording, is logged and noted on that model; the run syncs the others, and
    the model keeps what it had."""
    repos = [f"org/m{n}" for n in range(4)]
    for repo_id in repos:
        upload(fake_hub, repo_id, {"tokenizer_config.json": tc(CHATML)})
    models = [HubModel.objects.track(repo_id, via="track")[0] for repo_id in repos]
    look = RegistrySync.look

    def failing_look(self: RegistrySync, model: HubModel, **options: Any) -> Any:
        if model.repo_id == "org/m1":
            raise RuntimeError("a bug in reading")
        return look(self, model, **options)

    def failing_record(observed: list[tuple[int, Observation]]) -> list[Any]:
        if any(pk == models[2].pk for pk, _ in observed):
            raise ValueError("a bug in recording")
        return record_many_as_is(observed)

    record_many_as_is = sync_module.record_many
    monkeypatch.setattr(RegistrySync, "look", failing_look)
    monkeypatch.setattr(sync_module, "record_many", failing_record)
    results = sync_concurrently(models, concurrency=concurrency)
    assert [(r.repo_id, r.outcome) for r in results] == [
        ("org/m0", "updated"), ("org/m1", "failed"), ("org/m2", "failed"), ("org/m3", "updated"),
    ]  # fmt: skip
    noted = dict(HubModel.objects.values_list("repo_id", "sync_error"))
    assert (
        noted["org/m1"] == "sync failed reading the repo (RuntimeError); the last good sync is kept"
    )
    assert noted["org/m2"] == (
        "sync failed recording what the sync read (ValueError); the last good sync is kept"
    )
    assert noted["org/m0"] == noted["org/m3"] == ""
    assert set(HubModel.objects.filter(status="ok").values_list("repo_id", flat=True)) == {
        "org/m0", "org/m3",
    }  # fmt: skip
