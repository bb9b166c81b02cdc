"""The hub-queue tasks in a real Celery worker, against the fake Hub."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from registry.models import HubModel, ModelStatus, TemplateChange
from registry.tasks import sync_repo
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import fake_hub
from tests.workerproc import wait_for

pytestmark = pytest.mark.worker
__all__ = ["fake_hub"]


def test_tracking_through_the_api_gets_the_repo_synced_by_a_worker_once(
    celery_workers: Any, fake_hub: FakeHub, settings: Any
) -> None:
    settings.HF_ENDPOINT = fake_hub.url
    fake_hub.store.create_repo("acme/worked")
    fake_hub.store.add_commit(
        "acme/worked", {"tokenizer_config.json": tokenizer_config(b"{{ messages }}", None, None)}
    )
    celery_workers(
        queues="hub",
        extra_env={
            "HF_ENDPOINT": fake_hub.url,
            "HF_TOKEN": "",
            "HF_REQUESTS_PER_5MIN": "1000000000",
        },
    )
    response = Client().post(
        "/api/models", json.dumps({"repo_id": "acme/worked"}), content_type="application/json"
    )
    assert response.status_code == 201
    model = HubModel.objects.get(repo_id="acme/worked")
    wait_for(
        lambda: HubModel.objects.get(pk=model.pk).status == ModelStatus.OK, 60, "the queued sync"
    )
    # A duplicate delivery of the same task asks once (unchanged) and adds nothing.
    first_synced_at = HubModel.objects.get(pk=model.pk).last_synced_at
    fake_hub.reset_log()
    sync_repo.delay(model.pk)
    wait_for(
        lambda: HubModel.objects.get(pk=model.pk).last_synced_at != first_synced_at,
        60,
        "the second sync",
    )
    assert [r.path for r in fake_hub.requests()] == ["/api/models/acme/worked"]
    assert TemplateChange.objects.filter(model=model).count() == 1


def test_the_staff_button_runs_a_discovery_on_a_worker_that_then_syncs_what_it_found(
    celery_workers: Any, fake_hub: FakeHub, settings: Any
) -> None:
    from django.contrib.auth.models import User

    from registry.models import DiscoveryRun

    settings.HF_ENDPOINT = fake_hub.url
    for number in range(6):
        repo_id = f"chat/model-{number}"
        fake_hub.store.create_repo(
            repo_id, downloads=100 - number, tags=["conversational"], trending_score=number
        )
        fake_hub.store.add_commit(
            repo_id, {"tokenizer_config.json": tokenizer_config(b"{{ messages }}", None, None)}
        )
    fake_hub.store.create_repo("base/no-chat", downloads=1000, tags=[])  # not conversational
    celery_workers(
        queues="hub",
        extra_env={
            "HF_ENDPOINT": fake_hub.url,
            "HF_TOKEN": "",
            "HF_REQUESTS_PER_5MIN": "1000000000",
            "DISCOVERY_LIMIT": "4",
            "DISCOVERY_SORTS": "downloads,trendingScore",
            "DISCOVERY_PIPELINE_TAGS": "text-generation",
        },
    )
    client = Client()
    client.force_login(User.objects.create_user("ops", "o@example.org", "pw", is_staff=True))
    assert client.post("/discovery/run").status_code == 302
    run = DiscoveryRun.objects.get()
    wait_for(
        lambda: DiscoveryRun.objects.get(pk=run.pk).finished_at is not None, 60, "the discovery"
    )
    run.refresh_from_db()
    # Top 4 by downloads (0-3) and by trending (5-2): all six, not the untagged base.
    assert run.error == "" and run.new == 6
    assert sorted(run.new_repo_ids) == [f"chat/model-{n}" for n in range(6)]
    wait_for(
        lambda: not HubModel.objects.filter(status=ModelStatus.PENDING).exists(),
        90,
        "the first syncs of the new repos",
    )
    assert set(HubModel.objects.values_list("status", flat=True)) == {ModelStatus.OK}
    assert "Last discovery" in client.get("/discovery/").content.decode()


def _synced(repo_ids: list[str]) -> bool:
    return not HubModel.objects.filter(repo_id__in=repo_ids, last_synced_at__isnull=True).exists()


def test_a_worker_keeps_its_database_connection_between_tasks_and_survives_losing_it(
    celery_workers: Any, fake_hub: FakeHub, settings: Any
) -> None:
    """One PostgreSQL connection for many tasks (Celery alone opens one a task), and a
    connection the server dropped between two tasks costs a reconnect, not the next task."""
    import time

    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("counts PostgreSQL's sessions; the embedded defaults use SQLite")
    settings.HF_ENDPOINT = fake_hub.url
    repo_ids = [f"acme/kept-{number}" for number in range(9)]
    for repo_id in repo_ids:
        fake_hub.store.create_repo(repo_id)
        fake_hub.store.add_commit(
            repo_id, {"tokenizer_config.json": tokenizer_config(b"{{ messages }}", None, None)}
        )
    models = [HubModel.objects.create(repo_id=r, author="acme") for r in repo_ids]
    celery_workers(
        queues="hub",
        extra_env={"HF_ENDPOINT": fake_hub.url, "HF_TOKEN": "", "HF_REQUESTS_PER_5MIN": "10000"},
    )

    def sessions() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    before = sessions()
    for model in models[:8]:  # one after the other: each task could open its own
        sync_repo.delay(model.pk)
        wait_for(lambda m=model: _synced([m.repo_id]), 60, f"the sync of {model.repo_id}")
    time.sleep(1.5)  # a closed session is counted when its process exits
    # The worker's pool process, its main process and this test's: not one a task.
    assert sessions() - before <= 3

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1  # the worker's connection, dropped by the server
    sync_repo.delay(models[8].pk)
    wait_for(lambda: _synced(repo_ids), 60, "the sync after the connection was lost")
    assert HubModel.objects.get(pk=models[8].pk).status == ModelStatus.OK
