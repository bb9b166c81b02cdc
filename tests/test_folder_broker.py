"""The embedded broker (workers/broker.py): kombu's folder transport, whose consumer looks
again as soon as an acknowledgement frees a place in its prefetch, and reads messages from its
last listing of the folder. Real kombu connections on a temporary folder; messages written by
kombu's stock folder transport, as a web process that only sends writes them."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection, Consumer, Exchange, Message, Producer, Queue
from kombu.exceptions import ChannelError

from workers import broker
from workers.broker import FolderTransport

POLLING = 0.1


def options(folder: Path) -> dict[str, Any]:
    queue = folder / "queue"
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(exist_ok=True)
    return {
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": POLLING,
    }


def named(name: str) -> str:
    """A queue name of this test alone: kombu keeps the bindings it declared in a state shared
    by every folder connection of the process, and would skip binding a name again in another
    folder."""
    return f"{name}_{uuid.uuid4().hex[:8]}"


def send(folder: Path, queue: str, *bodies: str) -> None:
    """Publish with kombu's own folder transport (what a sending process uses)."""
    with Connection("filesystem://", transport_options=options(folder)) as conn:
        producer = Producer(conn.channel(), exchange=Exchange(queue, "direct"), routing_key=queue)
        for body in bodies:
            producer.publish(body, declare=[Queue(queue, Exchange(queue, "direct"), queue)])
            time.sleep(0.002)  # kombu names messages by the millisecond, a tie by a uuid


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def consumer_conn(folder: Path) -> Iterator[Connection]:
    conn = Connection("filesystem://", transport=FolderTransport, transport_options=options(folder))
    yield conn
    conn.release()


def test_the_settings_use_it_for_the_embedded_broker_only(settings: Any) -> None:
    from workers.celery import app

    with app.connection_for_write() as conn:
        used = conn.transport_cls
    if settings.REDIS_URL:
        assert settings.CELERY_BROKER_URL.startswith("redis")
        assert not hasattr(settings, "CELERY_BROKER_TRANSPORT")
    else:
        assert settings.CELERY_BROKER_TRANSPORT == "workers.broker:FolderTransport"
        assert used == "workers.broker:FolderTransport"


@contextmanager
def holding_the_first(conn: Connection, queue: str) -> Iterator[list[Message]]:
    """Consume `queue` with a prefetch of one; the messages delivered, the first one already
    (not acknowledged)."""
    got: list[Message] = []
    bound = Queue(queue, Exchange(queue, "direct"), queue)
    with Consumer(conn.channel(), [bound], callbacks=[lambda body, msg: got.append(msg)]) as c:
        c.qos(prefetch_count=1)
        conn.drain_events(timeout=1)
        yield got


def test_a_full_prefetch_waits_for_an_acknowledgement_and_an_empty_queue_for_the_interval(
    folder: Path, consumer_conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = named("hub")
    send(folder, hub, "one", "two", "three")
    sleeps: list[float] = []
    woken: list[bool] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    def wait_for_place(self: FolderTransport, seconds: float) -> bool:
        woken.append(self.freed.wait(seconds))
        return woken[-1]

    monkeypatch.setattr(FolderTransport, "sleep", staticmethod(sleep))
    monkeypatch.setattr(FolderTransport, "wait_for_place", wait_for_place)
    with holding_the_first(consumer_conn, hub) as got:
        assert [m.decode() for m in got] == ["one"]
        assert sleeps == woken == []  # a message waited: no wait at all

        # "one" is not acknowledged: the prefetch holds "two" back, and nothing frees a place.
        with pytest.raises(TimeoutError):
            consumer_conn.drain_events(timeout=0.15)
        assert woken and not any(woken) and sleeps == []
        assert len(got) == 1

        # The pool's result thread acknowledges "one" while the consumer waits: it wakes at
        # the acknowledgement, not at the end of its wait (the whole polling interval).
        woken.clear()
        acknowledging = threading.Timer(0.02, got[0].ack)
        acknowledging.start()
        consumer_conn.drain_events(timeout=1)
        acknowledging.join()
        assert [m.decode() for m in got] == ["one", "two"]
        assert woken == [True] and sleeps == []

        # Acknowledged before the consumer looks: the next message comes without a wait.
        woken.clear()
        got[1].ack()
        consumer_conn.drain_events(timeout=1)
        assert woken == [] and sleeps == []
        got[2].ack()

        # Nothing left: the consumer waits the whole polling interval between looks.
        with pytest.raises(TimeoutError):
            consumer_conn.drain_events(timeout=0.25)
        assert sleeps and set(sleeps) == {POLLING}
    assert [m.decode() for m in got] == ["one", "two", "three"]


def test_a_place_freed_during_a_look_is_not_slept_through(
    folder: Path, consumer_conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look finds the prefetch full, and an acknowledgement lands before the consumer
    decides how to wait: it looks again at once instead of sleeping the polling interval."""
    hub = named("hub")
    send(folder, hub, "one", "two")
    sleeps: list[float] = []
    monkeypatch.setattr(FolderTransport, "sleep", staticmethod(sleeps.append))
    with holding_the_first(consumer_conn, hub) as got:
        transport = consumer_conn.transport
        assert isinstance(transport, FolderTransport)
        full = transport.prefetch_full

        def acknowledged_meanwhile() -> bool:
            if got[0].acknowledged:
                return full()
            got[0].ack()  # after the look came back empty, before the check
            return False

        monkeypatch.setattr(transport, "prefetch_full", acknowledged_meanwhile)
        consumer_conn.drain_events(timeout=1)
    assert [m.decode() for m in got] == ["one", "two"]
    assert sleeps == []


def body(message: dict[str, Any]) -> str:
    return base64.b64decode(message["body"]).decode()


def counting_listings(
    conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> tuple[broker.FolderChannel, list[str]]:
    """A channel of `conn`, and the folder listings its reads make ("listed" each)."""
    listings: list[str] = []
    relist = broker.FolderChannel._relist

    def counted(self: broker.FolderChannel) -> None:
        listings.append("listed")
        relist(self)

    monkeypatch.setattr(broker.FolderChannel, "_relist", counted)
    channel = conn.channel()
    assert isinstance(channel, broker.FolderChannel)
    return channel, listings


def test_messages_come_oldest_first_queue_by_queue_from_one_listing(
    folder: Path, consumer_conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, checks = named("hub"), named("checks")
    for i in range(3):
        send(folder, hub, f"hub-{i}")
        send(folder, checks, f"checks-{i}")
    channel, listings = counting_listings(consumer_conn, monkeypatch)
    taken = [channel._get(hub), channel._get(checks), channel._get(hub)]
    assert [body(m) for m in taken] == ["hub-0", "checks-0", "hub-1"]
    assert [m["properties"]["delivery_info"]["routing_key"] for m in taken] == [hub, checks, hub]
    assert len(listings) == 1  # three messages of two queues, one listing of the folder

    # Another consumer takes the next "hub" message first: it is skipped, not an error.
    queue_dir = folder / "queue"
    theirs = sorted(queue_dir.glob(f"*.{hub}.msg"))[0]
    theirs.unlink()
    with pytest.raises(Empty):
        channel._get(hub)

    # A message sent after the listing is found once the queue has nothing left listed.
    send(folder, hub, "hub-late")
    time.sleep(broker.RELIST_AFTER)
    assert body(channel._get(hub)) == "hub-late"
    assert [body(channel._get(checks)) for _ in range(2)] == ["checks-1", "checks-2"]
    assert not list(queue_dir.iterdir())  # every message taken once, none left behind


def test_messages_stay_oldest_first_when_the_millisecond_count_gains_a_digit(
    folder: Path, consumer_conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu names a message by the monotonic millisecond; sorted as text, "100000_..." came
    before "99999_...", so the messages sent just after the count gained a digit jumped the
    queue (at 27.8 hours of uptime, then 11.6 days)."""
    hub = named("hub")
    send(folder, hub, "placeholder")  # makes the queue, and a message to rename
    queue_dir = folder / "queue"
    (sent,) = queue_dir.glob(f"*.{hub}.msg")
    message = json.loads(sent.read_text())
    sent.unlink()
    for stamp, text in [(99_998, "older"), (99_999, "old"), (100_000, "new")]:
        message["body"] = base64.b64encode(text.encode()).decode()
        (queue_dir / f"{stamp}_{uuid.uuid4()}.{hub}.msg").write_text(json.dumps(message))
    # A name whose stamp is no number to `int` ("²" is a digit to `isdigit`) is listed first,
    # then dropped as not a message; it must not stop the listing.
    (queue_dir / f"\u00b2_{uuid.uuid4()}.{hub}.msg").write_text("not a message")
    channel, _ = counting_listings(consumer_conn, monkeypatch)
    assert [body(channel._get(hub)) for _ in range(3)] == ["older", "old", "new"]
    assert not list(queue_dir.iterdir())


def test_an_empty_queue_lists_the_folder_at_the_polling_interval_a_busy_one_sooner(
    folder: Path, consumer_conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, pidbox = named("hub"), named("pidbox")
    send(folder, hub, "hub-0")
    channel, listings = counting_listings(consumer_conn, monkeypatch)
    assert body(channel._get(hub)) == "hub-0"
    assert listings == ["listed"]

    # 30 ms after the listing: past RELIST_AFTER, well within the polling interval (0.1 s).
    channel._listed_at = time.monotonic() - 0.03
    with pytest.raises(Empty):
        channel._get(pidbox)  # had nothing at the last listing: not listed again yet
    assert listings == ["listed"]
    with pytest.raises(Empty):
        channel._get(hub)  # had a message: may have more, listed again
    assert listings == ["listed"] * 2

    # The hub queue had nothing at that listing either: now both wait the polling interval.
    send(folder, pidbox, "ping")
    channel._listed_at = time.monotonic() - 0.03
    for queue in (hub, pidbox):
        with pytest.raises(Empty):
            channel._get(queue)
    assert listings == ["listed"] * 2
    channel._listed_at = time.monotonic() - POLLING
    assert body(channel._get(pidbox)) == "ping"
    assert listings == ["listed"] * 3


def test_a_real_celery_worker_on_the_folder_broker_runs_a_queue_of_tasks(tmp_path: Path) -> None:
    """A Celery worker (two processes) on this transport drains a queue of short tasks, each
    run once, the way `make run`'s worker drains a discovery's first syncs."""
    app_module = tmp_path / "foldertasks.py"
    out = tmp_path / "done"
    out.mkdir()
    app_module.write_text(
        "from pathlib import Path\n"
        "from celery import Celery\n"
        f"app = Celery('foldertasks', broker='filesystem://')\n"
        "app.conf.update(\n"
        "    broker_transport='workers.broker:FolderTransport',\n"
        f"    broker_transport_options={options(tmp_path)!r},\n"
        "    task_acks_late=True, worker_prefetch_multiplier=1, task_ignore_result=True,\n"
        "    worker_hijack_root_logger=False,\n"
        ")\n"
        "@app.task(name='touch')\n"
        "def touch(n):\n"
        f"    path = Path({str(out)!r}) / str(n)\n"
        "    assert not path.exists(), 'run twice'\n"
        "    path.write_text('x')\n"
    )
    root = Path(__file__).resolve().parent.parent
    env = {"PYTHONPATH": f"{tmp_path}:{root}", "PATH": "/usr/bin:/bin"}
    # Sent from a process of its own, as a web process sends (this one keeps its own app).
    sender = "import foldertasks\nfor n in range(40): foldertasks.app.send_task('touch', args=[n])"
    subprocess.run([sys.executable, "-c", sender], cwd=tmp_path, env=env, check=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "foldertasks", "worker", "--concurrency", "2",
         "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle", "--without-gossip"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(out.iterdir())) < 40 and time.monotonic() < deadline:
            assert worker.poll() is None, worker.communicate()[0]
            time.sleep(0.1)
    finally:
        worker.terminate()
        log = worker.communicate(timeout=60)[0]
    assert sorted(int(p.name) for p in out.iterdir()) == list(range(40)), log
    assert "run twice" not in log
    assert not list((tmp_path / "queue").glob("*.touch.msg"))


def test_a_file_in_the_queue_that_is_not_a_message_is_dropped_not_the_worker(
    folder: Path,
    consumer_conn: Connection,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty or cut file (a send on a full disk, before `_put` wrote whole files) is logged
    and skipped: raising it ended the worker, which was started again, to meet the next one,
    one file a restart."""
    hub = named("hub")
    send(folder, hub, "first")
    queue_dir = folder / "queue"
    # Named as kombu names a message (by the monotonic millisecond), so that they sort between
    # the two sends whatever the clock's first digit: "1_..." sorted after "17..." but before
    # "3...", and the test passed or failed with the machine's uptime.
    now = int(round(time.monotonic() * 1000))
    (queue_dir / f"{now}_{uuid.uuid4()}.{hub}.msg").write_bytes(b"")
    (queue_dir / f"{now + 1}_{uuid.uuid4()}.{hub}.msg").write_bytes(b'{"body": "cut sh')
    time.sleep(0.004)
    send(folder, hub, "second")
    channel, _ = counting_listings(consumer_conn, monkeypatch)
    assert [body(channel._get(hub)) for _ in range(2)] == ["first", "second"]
    assert sum("not a message" in r.getMessage() for r in caplog.records) == 2
    assert not list(queue_dir.iterdir())


def test_a_send_that_cannot_be_written_whole_leaves_nothing_in_the_queue(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a full disk does to the last step of a send: the message is written under a name
    no consumer lists, and only renamed into the queue once whole."""
    hub = named("hub")
    conn = Connection("filesystem://", transport=FolderTransport, transport_options=options(folder))

    def full(source: str, target: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    producer = Producer(conn.channel(), exchange=Exchange(hub, "direct"), routing_key=hub)
    with pytest.raises(ChannelError, match="Cannot add file"):
        producer.publish("lost", declare=[Queue(hub, Exchange(hub, "direct"), hub)])
    conn.release()
    assert not list((folder / "queue").iterdir())
