"""The PostgreSQL backend (cachesafe/db/base.py): a kept connection is checked before a
request's first query without a query, and one the server closed is found and replaced."""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator
from typing import cast

import pytest
from django.db import connection, connections

from cachesafe.db.base import DatabaseWrapper, waiting

pytestmark = pytest.mark.django_db


def test_a_socket_is_waiting_once_its_peer_wrote_or_hung_up() -> None:
    mine, peer = socket.socketpair()
    with mine, peer:
        assert not waiting(mine.fileno())
        peer.sendall(b"E")  # an unasked message, as the server's last words
        assert waiting(mine.fileno())
        mine.recv(1)
        assert not waiting(mine.fileno())
        peer.close()  # the end of the stream
        assert waiting(mine.fileno())


@pytest.fixture
def other() -> Iterator[DatabaseWrapper]:
    """A second connection to the test database, as a web process keeps one."""
    if connection.vendor != "postgresql":
        pytest.skip("the backend is PostgreSQL's")
    wrapper = cast(DatabaseWrapper, connections.create_connection("default"))
    wrapper.ensure_connection()
    yield wrapper
    wrapper.close()


def activity(pid: int) -> tuple[str, str] | None:
    """What the server says backend `pid` last ran, and its state (None once it is gone)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT query, state FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def checked_before_a_request(wrapper: DatabaseWrapper) -> None:
    """What Django does before a request's first query: the health check, closing the
    connection if it fails."""
    wrapper.health_check_done = False  # type: ignore[attr-defined]
    wrapper.close_if_health_check_failed()


def test_a_kept_connection_is_checked_without_a_query(other: DatabaseWrapper) -> None:
    with other.cursor() as cursor:
        cursor.execute("SELECT 'before the check'")
    pid = other.connection.info.backend_pid
    checked_before_a_request(other)
    assert other.connection is not None and other.connection.info.backend_pid == pid
    assert other.is_usable()
    assert activity(pid) == ("SELECT 'before the check'", "idle")  # no SELECT 1 since


def test_a_connection_the_server_closed_is_found_and_replaced(other: DatabaseWrapper) -> None:
    pid = other.connection.info.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 10  # the server ends the backend, then the socket says so
    while other.is_usable() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not other.is_usable()
    checked_before_a_request(other)
    assert other.connection is None
    with other.cursor() as cursor:  # a new connection, and the page's query answered
        cursor.execute("SELECT pg_backend_pid()")
        (new_pid,) = cursor.fetchone()
    assert new_pid != pid and activity(pid) is None


def test_a_closed_connection_is_not_usable(other: DatabaseWrapper) -> None:
    other.connection.close()
    assert not other.is_usable()


def test_a_connection_past_descriptor_1023_is_checked_too() -> None:
    """`select` refuses a descriptor past 1,023: a process holding that many files would have
    found every connection unusable (`waiting` polls instead)."""
    if connection.vendor != "postgresql":
        pytest.skip("the backend is PostgreSQL's")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may hold {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    wrapper = cast(DatabaseWrapper, connections.create_connection("default"))
    try:
        wrapper.ensure_connection()
        assert wrapper.connection.pgconn.socket > 1023
        assert wrapper.is_usable()
    finally:
        wrapper.close()
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
