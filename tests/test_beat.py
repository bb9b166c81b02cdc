"""Beat stops on SIGTERM, whatever it was doing when the signal came."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.apps.beat import Beat
from celery.beat import Scheduler, Service
from django.db import DatabaseError

from workers.beat import stop_on_sigterm
from workers.celery import app

CLOSED = "Cannot operate on a closed database."


class UnbuildableScheduler(Scheduler):
    """A scheduler whose construction fails as django-celery-beat's did in a beat's first
    seconds: built a second time inside the signal handler, on a closed connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise DatabaseError(CLOSED)


class UnsavableScheduler(Scheduler):
    """Built, but cannot save its schedule (the database is gone)."""

    def close(self) -> None:
        raise DatabaseError(CLOSED)


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def sigterm_raises(sig: signal.Signals = signal.SIGTERM) -> BaseException:
    """Send this process `sig`; Python runs the handler in this thread, at once."""
    try:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler interrupts the sleep
    except BaseException as exc:
        return exc
    raise AssertionError(f"{sig.name} raised nothing")


def test_celerys_own_handler_raises_the_database_error_instead_of_stopping(
    restored_handlers: None,
) -> None:
    """Why beat has a handler of ours: Celery's let the error through, and beat ran on."""
    service = Service(app=app, scheduler_cls=UnbuildableScheduler)
    Beat(app=app, quiet=True).install_sync_handler(service)
    raised = sigterm_raises()
    assert isinstance(raised, DatabaseError)
    assert not isinstance(raised, SystemExit)


def test_sigterm_before_the_scheduler_is_built_stops_beat(restored_handlers: None) -> None:
    service = Service(app=app, scheduler_cls=UnbuildableScheduler)
    stop_on_sigterm(service)
    raised = sigterm_raises()
    assert isinstance(raised, SystemExit)
    assert "scheduler" not in vars(service), "the handler built a scheduler"


def test_sigterm_saves_a_built_schedule_and_stops_even_when_saving_fails(
    restored_handlers: None, caplog: pytest.LogCaptureFixture
) -> None:
    service = Service(app=app, scheduler_cls=UnsavableScheduler)
    assert service.scheduler is not None  # built
    stop_on_sigterm(service)
    with caplog.at_level(logging.ERROR, logger="workers.beat"):
        raised = sigterm_raises()
    assert isinstance(raised, SystemExit)
    assert "beat could not save its schedule while stopping" in caplog.text
    assert CLOSED in caplog.text


def test_sigint_stops_beat_too(restored_handlers: None) -> None:
    service = Service(app=app, scheduler_cls=UnbuildableScheduler)
    stop_on_sigterm(service)
    assert isinstance(sigterm_raises(signal.SIGINT), SystemExit)
