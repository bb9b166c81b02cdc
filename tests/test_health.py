from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from workers.models import BeatTick, WorkerHeartbeat

pytestmark = pytest.mark.django_db


def _alive_worker() -> None:
    WorkerHeartbeat.beat("main@test", ["checks", "default", "hub", "notify"], {"pid": 1})


def test_healthz_is_200_only_when_worker_and_beat_are_alive(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["database"]["ok"] is True
    assert body["broker"]["ok"] is True
    assert body["worker"]["detail"] == "Worker has never reported"

    _alive_worker()
    BeatTick.record()
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "ok"


def test_a_silent_worker_is_reported_offline_with_the_time(client: Client) -> None:
    _alive_worker()
    BeatTick.record()
    stale = timezone.now() - timedelta(minutes=5)
    WorkerHeartbeat.objects.update(last_seen=stale)
    body = client.get("/healthz").json()
    assert body["worker"]["ok"] is False
    assert body["worker"]["detail"].startswith("Worker offline since ")
    assert stale.strftime("%H:%M") in body["worker"]["detail"]


def test_the_mac_worker_is_reported_but_does_not_fail_health(client: Client) -> None:
    _alive_worker()
    BeatTick.record()
    WorkerHeartbeat.beat("mac@studio", ["mlx"], {"chip": "Apple M4 Max"})
    WorkerHeartbeat.objects.filter(hostname="mac@studio").update(
        last_seen=timezone.now() - timedelta(hours=1)
    )
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["probe_worker"]["detail"].startswith("Mac probe worker offline since")


def test_healthz_refuses_post(client: Client) -> None:
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_healthz_answers_503_not_500_when_a_table_is_missing() -> None:
    """Before `migrate` ran (or the database lost the table): a clear status, not a 500."""
    WorkerHeartbeat.beat("main@test", ["checks", "default", "hub", "notify"], {"pid": 1})
    BeatTick.record()

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic():  # a savepoint: the table comes back after the request
            with connection.cursor() as cursor:
                cursor.execute("DROP TABLE workers_workerheartbeat CASCADE")
            response = Client(raise_request_exception=False).get("/healthz")
            raise Rollback
    except Rollback:
        pass
    # Before: 500, Django's HTML error page (ProgrammingError).
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
