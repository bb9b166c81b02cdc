"""Migrations keep every row: a database populated before a table changed owner is migrated
forward, and what the old apps held is found through the new owner's models."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

#: The last state before registry took over ModelEvent, Lease, ProbeRun and CatalogVerdict.
BEFORE_HANDOVER = [
    ("registry", "0003_tokenizer_file"),
    ("workers", "0004_probe_run"),
    ("dashboard", "0003_probe_verdicts"),
    ("alerts", "0001_initial"),
]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def latest() -> list[tuple[str, str]]:
    nodes: list[tuple[str, str]] = MigrationExecutor(connection).loader.graph.leaf_nodes()
    return nodes


def test_the_domain_tables_change_owner_with_every_row() -> None:
    old = migrate(BEFORE_HANDOVER)
    model = old.get_model("registry", "HubModel").objects.create(repo_id="org/model", author="org")
    event = old.get_model("workers", "ModelEvent").objects.create(
        model_id=model.pk, kind="verdict_changed", key="verdict:1", summary="safe → unsafe"
    )
    old.get_model("workers", "Lease").objects.create(
        key="check:7", holder="host:1", expires_at="2026-01-01T00:00:00Z"
    )
    probe = old.get_model("workers", "ProbeRun").objects.create(
        model_id=model.pk, commit_sha="a" * 40, state="done", verdict="partial"
    )
    old.get_model("dashboard", "CatalogVerdict").objects.create(
        model_id=model.pk, thinking="differs", tools="safe", probe="partial"
    )
    user = old.get_model("auth", "User").objects.create(username="reader")
    channel = old.get_model("alerts", "Channel").objects.create(
        owner_id=user.pk, kind="webhook", url="https://example.org/hook"
    )
    delivery = old.get_model("alerts", "Delivery").objects.create(
        event_id=event.pk, channel_id=channel.pk
    )

    migrate(latest())

    from alerts.models import Delivery
    from registry.models import CatalogVerdict, Lease, ModelEvent, ProbeRun

    moved_event = ModelEvent.objects.get(pk=event.pk)
    assert (moved_event.model_id, moved_event.key) == (model.pk, "verdict:1")
    assert Lease.objects.get(key="check:7").holder == "host:1"
    assert ProbeRun.objects.get(pk=probe.pk).verdict == "partial"
    row = CatalogVerdict.objects.get(model_id=model.pk)
    assert (row.thinking, row.tools, row.probe) == ("differs", "safe", "partial")
    # The foreign key from alerts follows the renamed table, and still cascades.
    assert Delivery.objects.get(pk=delivery.pk).event == moved_event
    moved_event.delete()
    assert not Delivery.objects.filter(pk=delivery.pk).exists()
    tables = connection.introspection.table_names()
    assert {"registry_modelevent", "registry_lease", "registry_proberun"} <= set(tables)
    assert not {"workers_modelevent", "workers_proberun", "dashboard_catalogverdict"} & set(tables)


def test_the_reuse_figures_move_to_the_model_and_back() -> None:
    """Registry 0016 moves each catalog row's reuse figure onto its model (a model without a
    row, or without a figure, has none), and going back puts every figure on its row again."""
    before, after = (
        [("registry", "0015_changed_order_index")],
        [("registry", "0016_reuse_on_the_model")],
    )
    old = migrate(before)
    hub_model = old.get_model("registry", "HubModel")
    catalog_verdict = old.get_model("registry", "CatalogVerdict")
    figures = {"org/high": 0.9, "org/none": None, "org/low": 0.25}
    for repo_id, figure in figures.items():
        model = hub_model.objects.create(repo_id=repo_id, author="org")
        catalog_verdict.objects.create(model_id=model.pk, reuse=figure)
    hub_model.objects.create(repo_id="org/unchecked", author="org")

    new = migrate(after)
    moved = dict(new.get_model("registry", "HubModel").objects.values_list("repo_id", "reuse"))
    assert moved == figures | {"org/unchecked": None}
    assert "reuse" not in {f.name for f in new.get_model("registry", "CatalogVerdict")._meta.fields}

    back = migrate(before)
    rows = back.get_model("registry", "CatalogVerdict").objects.values_list(
        "model__repo_id", "reuse"
    )
    assert dict(rows) == figures
    migrate(latest())


def test_a_repo_tracked_in_other_letters_merges_into_its_oldest_row() -> None:
    """Registry 0021 makes a repo id unique in any letters. Rows a race left in other letters
    merge into the oldest (the one lookups found): subscriptions, probe runs and events move
    to it, a subscription on a channel that already had one is folded into it, and the other
    rows go with what the next sync fetches again."""
    old = migrate([("registry", "0020_sync_failing_index"), ("alerts", "0004_team_invitation")])
    hub_model = old.get_model("registry", "HubModel")
    kept, second, third = (
        hub_model.objects.create(repo_id=repo_id, author=repo_id.split("/")[0])
        for repo_id in ("Acme/Chat-8B", "acme/chat-8b", "ACME/CHAT-8B")
    )
    hub_model.objects.create(repo_id="acme/other", author="acme")
    for model in (kept, second, third):
        old.get_model("registry", "CatalogVerdict").objects.create(model_id=model.pk)
    probe = old.get_model("registry", "ProbeRun").objects.create(
        model_id=second.pk, commit_sha="b" * 40, state="done", verdict="full"
    )
    event = old.get_model("registry", "ModelEvent").objects.create(
        model_id=third.pk, kind="verdict_changed", key="verdict:3", summary="safe → unsafe"
    )
    user = old.get_model("auth", "User").objects.create(username="reader")
    channel, other_channel = (
        old.get_model("alerts", "Channel").objects.create(owner_id=user.pk, kind="webhook", url=url)
        for url in ("https://example.org/one", "https://example.org/two")
    )
    delivery = old.get_model("alerts", "Delivery").objects.create(
        event_id=event.pk, channel_id=channel.pk
    )
    subscription = old.get_model("alerts", "Subscription").objects
    wish = subscription.create(
        user_id=user.pk, channel_id=channel.pk, target="model", model_id=kept.pk, on_probe=False
    )
    subscription.create(
        user_id=user.pk, channel_id=channel.pk, target="model", model_id=second.pk,
        on_template=False,
    )  # fmt: skip
    elsewhere = subscription.create(
        user_id=user.pk, channel_id=other_channel.pk, target="model", model_id=third.pk
    )

    new = migrate([("registry", "0021_one_model_per_repo_id")])

    models = new.get_model("registry", "HubModel").objects
    assert sorted(models.values_list("repo_id", flat=True)) == ["Acme/Chat-8B", "acme/other"]
    assert new.get_model("registry", "ProbeRun").objects.get(pk=probe.pk).model_id == kept.pk
    assert new.get_model("registry", "ModelEvent").objects.get(pk=event.pk).model_id == kept.pk
    assert new.get_model("alerts", "Delivery").objects.filter(pk=delivery.pk).exists()
    wishes = new.get_model("alerts", "Subscription").objects.filter(model_id=kept.pk)
    assert sorted(wishes.values_list("pk", flat=True)) == sorted([wish.pk, elsewhere.pk])
    folded = wishes.get(pk=wish.pk)
    assert folded.on_template and folded.on_probe  # each the other asked for
    rows = new.get_model("registry", "CatalogVerdict").objects.values_list("model_id", flat=True)
    assert list(rows) == [kept.pk]
    with pytest.raises(IntegrityError), transaction.atomic():
        models.create(repo_id="acme/CHAT-8b", author="acme")
    migrate(latest())
