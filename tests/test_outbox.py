"""Nothing asked for is lost to a broker outage: every enqueue goes through the outbox."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from kombu.exceptions import OperationalError

from registry import jobs
from registry.models import HubModel, OutboxMessage
from registry.tasks import run_check, sync_repo
from registry.tracking import track

pytestmark = pytest.mark.django_db(transaction=True)


def broker_down(*args: Any, **kwargs: Any) -> None:
    raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def age_outbox() -> None:
    """Rows younger than the flush's grace period belong to a send still under way."""
    OutboxMessage.objects.update(created_at=timezone.now() - timedelta(minutes=1))


def test_a_sent_message_leaves_no_row(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(sync_repo, "apply_async", lambda args, kwargs, **o: sent.append(args))
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        model, _ = track("org/fine", via="api")
        assert OutboxMessage.objects.count() == 1  # written with the change itself
        assert sent == []  # nothing leaves before commit
    assert sent == [(model.pk,)]
    assert not OutboxMessage.objects.exists()
    # After the commit, the row goes in one statement: no transaction of its own.
    statements = [q["sql"] for q in queries.captured_queries]
    after = statements[statements.index("COMMIT") + 1 :]
    outbox = [i for i, sql in enumerate(after) if "outboxmessage" in sql]
    assert len(outbox) == 1 and after[outbox[0]].startswith('DELETE FROM "registry_outboxmessage"')
    assert after[outbox[0] - 1 : outbox[0]] != ["BEGIN"]


def test_a_rolled_back_change_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(sync_repo, "apply_async", lambda args, kwargs, **o: sent.append(args))
    with pytest.raises(RuntimeError), transaction.atomic():
        track("org/undone", via="api")
        raise RuntimeError
    assert sent == [] and not OutboxMessage.objects.exists()


def test_a_message_the_broker_refused_is_kept_and_sent_when_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sync_repo, "apply_async", broker_down)
    model, _ = track("org/outage", via="api")  # must not raise
    [row] = OutboxMessage.objects.all()
    assert (row.task, row.args, row.attempts) == ("hub.sync_repo", [model.pk], 1)
    assert "Connection refused" in row.last_error

    still_down: list[str] = []

    def refuse(name: str, **options: Any) -> None:
        still_down.append(name)
        broker_down()

    # Meanwhile this process does not try the broker again for each new message.
    tries: list[Any] = []
    monkeypatch.setattr(sync_repo, "apply_async", lambda *a, **k: tries.append(a))
    track("org/outage-too", via="api")
    assert tries == [] and OutboxMessage.objects.count() == 2
    OutboxMessage.objects.exclude(pk=row.pk).delete()

    age_outbox()
    assert jobs.flush_outbox(refuse) == 0
    assert still_down == ["hub.sync_repo"]  # one try per run while the broker is down
    assert OutboxMessage.objects.get().attempts == 2

    sent: list[tuple[str, dict[str, Any]]] = []
    assert jobs.flush_outbox(lambda name, **options: sent.append((name, options))) == 1
    assert sent == [("hub.sync_repo", {"args": [model.pk], "kwargs": {"force": False}})]
    assert not OutboxMessage.objects.exists()


def test_track_webhook_and_recheck_answer_without_error_while_the_broker_is_down(
    client: Client, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from django.contrib.auth.models import User

    from tests.dashboard_data import build_catalog

    catalog = build_catalog()
    monkeypatch.setattr(sync_repo, "apply_async", broker_down)
    monkeypatch.setattr(run_check, "apply_async", broker_down)

    tracked = client.post(
        "/api/models", {"repo_id": "org/while-down"}, content_type="application/json"
    )
    assert tracked.status_code in (201, 202), tracked.content

    settings.HF_WEBHOOK_SECRET = "s3cret"
    hook = client.post(
        "/hooks/hub",
        {"event": {"action": "update", "scope": "repo.content"},
         "repo": {"type": "model", "name": catalog.unsafe.repo_id}},
        content_type="application/json",
        headers={"X-Webhook-Secret": "s3cret"},
    )  # fmt: skip
    assert hook.status_code < 500, hook.content

    User.objects.create_user("staff", password="pw", is_staff=True)
    client.login(username="staff", password="pw")
    recheck = client.post(f"/m/{catalog.unsafe.repo_id}/recheck")
    assert recheck.status_code < 500

    kept = set(OutboxMessage.objects.values_list("task", flat=True))
    assert {"hub.sync_repo", "workers.run_check"} <= kept
    assert HubModel.objects.filter(repo_id="org/while-down").exists()


@pytest.fixture
def cut_broker(settings: Any) -> Any:
    """The web process's own connection to the broker goes through a proxy the test can cut."""
    from tests.tcpproxy import TcpProxy
    from workers.celery import app

    if not settings.REDIS_URL:
        pytest.skip("cuts the Redis broker")
    host_port, db = settings.REDIS_URL.split("//", 1)[1].rsplit("/", 1)
    proxy = TcpProxy("127.0.0.1", int(host_port.rsplit(":", 1)[1])).start()
    original = app.conf.broker_url

    def use(url: str) -> None:
        app.conf.update(broker_url=url)
        # The next send connects anew, to `url` (kombu keeps each URL's pool for later): the
        # app's cached pools are private, and there is no public way to drop them.
        app._pool = None  # type: ignore[attr-defined]
        app.amqp._producer_pool = None  # type: ignore[attr-defined]

    use(f"redis://127.0.0.1:{proxy.port}/{db}")
    yield proxy
    proxy.stop()
    use(original)


def test_a_real_broker_cut_during_track_webhook_and_recheck_loses_nothing(
    client: Client, cut_broker: Any, settings: Any
) -> None:
    import redis
    from django.contrib.auth.models import User

    from tests.dashboard_data import build_catalog
    from workers.celery import app

    catalog = build_catalog()
    settings.HF_WEBHOOK_SECRET = "s3cret"
    User.objects.create_user("staff", password="pw", is_staff=True)
    queues = redis.Redis.from_url(settings.REDIS_URL)
    queues.delete("hub", "checks")

    cut_broker.stop()
    tracked = client.post("/api/models", {"repo_id": "org/cut"}, content_type="application/json")
    assert tracked.status_code == 201, tracked.content
    hook = client.post(
        "/hooks/hub",
        {"event": {"action": "update", "scope": "repo.content"},
         "repo": {"type": "model", "name": catalog.unsafe.repo_id}},
        content_type="application/json",
        headers={"X-Webhook-Secret": "s3cret"},
    )  # fmt: skip
    assert hook.status_code == 202, hook.content
    client.login(username="staff", password="pw")
    recheck = client.post(f"/m/{catalog.unsafe.repo_id}/recheck")
    assert recheck.status_code in (200, 302), recheck.status_code
    kept = sorted(OutboxMessage.objects.values_list("task", flat=True))
    assert kept == ["hub.sync_repo", "hub.sync_repo", "workers.run_check"]
    assert queues.llen("hub") == queues.llen("checks") == 0

    cut_broker.start()  # the same port: the broker is back
    age_outbox()
    assert jobs.flush_outbox(app.send_task) == 3
    assert (queues.llen("hub"), queues.llen("checks")) == (2, 1)  # routed by name
    assert not OutboxMessage.objects.exists()
    queues.delete("hub", "checks")


def test_every_task_asked_for_by_name_is_registered() -> None:
    """Receivers enqueue by name (a web process never imports the tasks' modules): each name
    they use must be a task the workers register."""
    import ast
    from pathlib import Path

    import alerts.tasks
    import probe.tasks
    import registry.tasks
    import workers.tasks
    from alerts.receivers import TASKS
    from workers.celery import app

    assert registry.tasks and alerts.tasks and probe.tasks and workers.tasks  # registered now
    root = Path(__file__).resolve().parents[1]
    named = set(TASKS.values())
    for path in [*root.glob("registry/*.py"), *root.glob("alerts/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "enqueue_on_commit"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                named.add(str(node.args[0].value))
    assert {"hub.sync_repo", "workers.run_check", "workers.probe_model"} <= named
    assert named <= set(app.tasks), named - set(app.tasks)


def test_a_web_process_sends_by_name_without_having_imported_the_tasks() -> None:
    """A web worker never imports the tasks' modules to start; its first send has the app's
    `imports` load them (before, the name was unknown there and every send waited for the
    outbox's flush)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from alerts.receivers import TASKS

    names = ["hub.sync_repo", "hub.discover", "workers.run_check", "workers.probe_model"]
    names += sorted(TASKS.values())
    code = (
        "import sys, django; django.setup(); import cachesafe.urls; "
        "print('registry.tasks' in sys.modules); "
        "from registry.jobs import task_named; "
        "print(' '.join(task_named(name).name for name in sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *names],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "cachesafe.settings"},
    )
    assert result.returncode == 0, result.stderr
    before, resolved = result.stdout.strip().splitlines()[-2:]
    assert before == "False"
    assert resolved.split() == names


def test_a_web_process_serving_pages_never_loads_celery_and_its_first_send_does() -> None:
    """A web worker that serves pages (and checks the broker for the status banner) holds no
    Celery, kombu or billiard (about 11 MiB of it, docs/dashboard.md); its first send loads the
    app configured by the settings, and the task reaches the broker."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.workerproc import database_url_for_children

    code = """
import sys, django
django.setup()
from cachesafe.webserver import load_before_fork
load_before_fork()
from django.test import Client
from workers.health import service_status
client = Client()
for url in ("/", "/api/models", "/healthz", "/feeds/changes.atom"):
    assert client.get(url).status_code in (200, 503), url  # 503: /healthz, no worker here
status = service_status()
assert status.broker.ok, status.broker
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"celery", "kombu", "billiard", "amqp"})
print("before:", " ".join(loaded) or "none")
from registry.jobs import celery_app, enqueue_on_commit
enqueue_on_commit("workers.prune_heartbeats", 365)
from registry.models import OutboxMessage
print("after:", "celery" in sys.modules, celery_app().main, OutboxMessage.objects.count())
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "cachesafe.settings",
            "DATABASE_URL": database_url_for_children(),
        },
    )
    assert result.returncode == 0, result.stderr
    before, after = result.stdout.strip().splitlines()[-2:]
    assert before == "before: none"
    # Sent, so the outbox row is gone: the configured app ("cachesafe"), not a default one.
    assert after == "after: True cachesafe 0"
