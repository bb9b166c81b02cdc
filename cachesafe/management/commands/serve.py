"""`make run`: migrate, then run the web server, a Celery worker and beat in the foreground,
restarting any of them that dies until Ctrl-C."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, connection

from cachesafe.environment import ConfigError, Env

STOP_GRACE_SECONDS = 10.0
PR_SET_PDEATHSIG = 1
#: A dead child is restarted after 1 s, 2 s, 4 s ... at most 30 s; a minute up resets the delay.
RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0
STABLE_SECONDS = 60.0
POLL_SECONDS = 0.2


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise CommandError(
                f"Port {port} on {host} is already in use: stop what uses it, "
                f"or pick another port, e.g. PORT={port + 1} make run"
            ) from None


def check_database() -> None:
    try:
        connection.ensure_connection()
    except OperationalError as exc:
        where = settings.DATABASES["default"]["NAME"]
        raise CommandError(
            f"Cannot connect to the database {where!r}: {_first_line(exc)}. "
            "Fix DATABASE_URL (or unset it to use the embedded SQLite file)."
        ) from None


def check_broker() -> None:
    if not settings.REDIS_URL:
        return
    import redis

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3).ping()
    except (redis.RedisError, OSError) as exc:
        raise CommandError(
            f"Cannot reach Redis at {settings.REDIS_URL}: {_first_line(exc)}. "
            "Start Redis, fix REDIS_URL, or unset it to use the embedded broker."
        ) from None


class Command(BaseCommand):
    help = "Run CacheSafe locally: web server, Celery worker and beat, restarted when they die."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-demo", action="store_true", help="Do not seed the demo catalog.")

    def handle(self, *args: Any, **options: Any) -> None:
        env = Env.from_os()
        try:
            port = env.integer("PORT", 8000, minimum=1, maximum=65535)
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        host = env.text("HOST", "127.0.0.1")
        check_port_free(host, port)
        check_database()
        check_broker()

        call_command("migrate", interactive=False, verbosity=0)
        call_command("createcachetable", verbosity=0)
        if not options["no_demo"]:
            call_command("seed_demo", verbosity=0)

        # Links in pages and alerts name the address this server really answers on.
        if not env.is_set("SITE_URL"):
            os.environ["SITE_URL"] = f"http://{host}:{port}"
        python = sys.executable
        processes = {
            "web": [
                python, "-m", "gunicorn", "cachesafe.wsgi",
                "--config", "python:cachesafe.webserver",
                "--bind", f"{host}:{port}", "--workers", "2", "--graceful-timeout", "5",
            ],
            "worker": [
                python, "-m", "celery", "-A", "workers", "worker",
                "-Q", "default,hub,checks,notify", "-n", "main@%h",
                "--concurrency", "2", "--loglevel", "INFO",
            ],
            "beat": [python, "-m", "celery", "-A", "workers", "beat", "--loglevel", "INFO"],
        }  # fmt: skip
        self.stdout.write(f"CacheSafe on http://{host}:{port}/ (Ctrl-C stops everything)")
        self.stdout.flush()
        Supervisor([Child(name, command) for name, command in processes.items()]).run()


def log(message: str) -> None:
    # Stamped like the children's own log lines, which share this terminal.
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] serve: {message}", file=sys.stderr, flush=True)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when serve dies (Linux; elsewhere a no-op)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Child:
    """One command in its own process group, restarted with exponential backoff when it dies."""

    def __init__(self, name: str, command: list[str]) -> None:
        self.name = name
        self.command = command
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.quick_deaths = 0
        self.restart_at: float | None = None

    def start(self) -> None:
        # Its own group, so one killpg reaches the pool processes of a worker or gunicorn too;
        # and told to stop if serve itself is killed (no Ctrl-C reaches a group of its own).
        self.proc = subprocess.Popen(
            self.command, start_new_session=True, preexec_fn=_stop_with_parent
        )
        self.started_at = time.monotonic()
        self.restart_at = None

    def tend(self, now: float) -> None:
        """Restart the child when its backoff is over; notice (and log) when it has died."""
        if self.proc is None:
            return
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.start()
                log(f"{self.name} restarted (pid {self.proc.pid})")
            return
        code = self.proc.poll()
        if code is None:
            return
        # A dead leader leaves its pool processes behind; they would hold the port or the queue.
        self.kill_group()
        if now - self.started_at >= STABLE_SECONDS:
            self.quick_deaths = 0
        delay = min(RESTART_MAX_SECONDS, RESTART_FIRST_SECONDS * 2**self.quick_deaths)
        self.quick_deaths += 1
        self.restart_at = now + delay
        log(f"{self.name} (pid {self.proc.pid}) {describe_exit(code)}; restarting in {delay:g} s")

    def terminate(self) -> None:
        """Ask the leader to stop gracefully; it stops its own pool processes."""
        self.restart_at = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for the leader until `deadline`, then SIGKILL whatever is left of its group."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop in {STOP_GRACE_SECONDS:g} s; killing it")
        self.kill_group()
        self.proc.wait()

    def kill_group(self) -> None:
        if self.proc is None:
            return
        # ProcessLookupError: the group is empty, nothing was left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class Supervisor:
    """Keep every child running until SIGINT/SIGTERM, then stop them all and return.

    Written here rather than with honcho or supervisord: neither is a dependency, honcho stops
    everything when one process exits, and supervisord would need its own config and daemon.
    """

    def __init__(self, children: list[Child]) -> None:
        self.children = children
        self.stopping = False

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def run(self) -> None:
        # Handlers first: a Ctrl-C that lands while the children start still stops them all.
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        try:
            for child in self.children:
                child.start()
            while not self.stopping:
                now = time.monotonic()
                for child in self.children:
                    child.tend(now)
                time.sleep(POLL_SECONDS)
        finally:
            for child in self.children:
                child.terminate()
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for child in self.children:
                child.wait_or_kill(deadline)


if os.name != "posix":  # pragma: no cover - the service targets Linux and macOS
    raise ImportError("serve needs a POSIX system")
