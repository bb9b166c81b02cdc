"""The PostgreSQL backend (cachesafe/db/base.py): a kept connection is checked before a
request's first query without a query, and one the server closed is found and replaced."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import cast

import pytest
from django.db import connection, connections

from cachesafe.db.base import DatabaseWrapper

pytestmark = pytest.mark.django_db


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
