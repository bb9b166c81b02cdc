"""`make run`: migrate, then run the web server, a Celery worker and beat in the foreground,
restarting any of them that dies until Ctrl-C."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, connection, connections

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


def port_taken(host: str, port: int) -> str | None:
    """Why the web server cannot listen on `host`:`port` now (another program does), or None."""
    try:
        check_port_free(host, port)
    except CommandError as exc:
        return str(exc)
    return None


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As gunicorn binds: a port whose last connections wait out TIME_WAIT (a server just
        # stopped) is free; one another socket listens on is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
        raise CommandError(database_trouble("Cannot connect to", exc)) from None


def database_trouble(doing: str, exc: BaseException) -> str:
    """What went wrong with the database, and what to do: fix DATABASE_URL, or, for the
    embedded SQLite file, the folder it is in (read-only or full)."""
    where = settings.DATABASES["default"]["NAME"]
    said = f"{doing} the database {str(where)!r}: {_first_line(exc)}."
    if Env.from_os().is_set("DATABASE_URL"):
        return f"{said} Fix DATABASE_URL (or unset it to use the embedded SQLite file)."
    return f"{said} Is {settings.VAR_DIR} read-only or full? (CACHESAFE_VAR_DIR moves it.)"


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
        self.lock = hold_var_dir()  # for as long as serve runs: its file is closed at exit
        check_port_free(host, port)
        check_database()
        check_broker()

        try:
            call_command("migrate", interactive=False, verbosity=0)
            call_command("createcachetable", verbosity=0)
            if not options["no_demo"]:
                call_command("seed_demo", verbosity=0)
        except (OperationalError, OSError) as exc:  # connecting is not writing (read-only)
            raise CommandError(database_trouble("Cannot write to", exc)) from None

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
        # serve itself needs no database from here on, and the guardian it forks must not
        # inherit a connection.
        connections.close_all()
        self.stdout.write(f"CacheSafe on http://{host}:{port}/ (Ctrl-C stops everything)")
        self.stdout.flush()
        # A port taken after the check above (another `make run` that had not yet listened
        # when this one looked, from another folder) ends serve with that reason; the web
        # server used to be restarted every 30 s for ever, each time failing to listen.
        checks = {"web": lambda: port_taken(host, port)}
        children = [Child(name, command, checks.get(name)) for name, command in processes.items()]
        failure = Supervisor(children).run()
        if failure is not None:
            raise CommandError(failure)


def hold_var_dir() -> Any:
    """An exclusive lock on the folder this service keeps its state in (`VAR_DIR`), held until
    serve exits: a second `make run` from the same folder stops with a clear message. (Started
    a moment after the first, while that one migrated, it passed the port check and ran a
    second worker and beat on the same database and broker.)"""
    path = Path(settings.VAR_DIR) / "serve.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    except OSError as exc:
        raise CommandError(f"Cannot write to {path.parent}: {exc.strerror}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise CommandError(
            f"CacheSafe is already running from {path.parent}: stop it first (Ctrl-C in its "
            "terminal), or give this one its own CACHESAFE_VAR_DIR"
        ) from None
    return handle


def log(message: str) -> None:
    # Stamped like the children's own log lines, which share this terminal. Never raises: with
    # the terminal gone (closed), a failed write ended the guardian before it stopped anyone.
    with contextlib.suppress(OSError):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"[{stamp}] serve: {message}", file=sys.stderr, flush=True)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when serve dies (Linux; elsewhere the guardian
    sends it)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Guardian:
    """A process of its own that stops serve's children if serve dies without stopping them.

    `kill -9` or the OOM killer gives serve no chance to stop anything. Its children are told
    (SIGTERM, the parent-death signal on Linux; from here elsewhere), but a child can miss that
    one signal or take long over a graceful stop (a worker finishing its task), and nobody is
    left to insist. The guardian, forked before the children start, learns each child's process
    group through a pipe and reads until the pipe closes, which happens however serve ends. If
    groups are still registered then (serve died), it gives them STOP_GRACE_SECONDS, kills what
    is left of each group, and exits.
    """

    def __init__(self) -> None:
        self.pipe: int | None = None
        self.pid: int | None = None

    def start(self) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the guardian (tests/test_serve.py watches what it does)
            os.close(write_end)
            code = 1
            try:
                # Out of the terminal's process group: Ctrl-C is for serve, which then stops
                # its children itself and tells the guardian.
                os.setsid()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                guard(read_end)
                code = 0
            finally:
                os._exit(code)
        os.close(read_end)
        self.pipe, self.pid = write_end, pid

    def close(self) -> None:
        """Serve is stopping: the guardian reads the end of the pipe and exits; wait for it."""
        if self.pipe is not None:
            os.close(self.pipe)
            self.pipe = None
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None

    def tell(self, message: str) -> None:
        if self.pipe is None:
            return
        # A guardian that is gone cannot be told; serve runs on without it.
        with contextlib.suppress(OSError):
            os.write(self.pipe, f"{message}\n".encode())

    def started(self, group: int, name: str) -> None:
        self.tell(f"+{group} {name}")

    def stopped(self, group: int) -> None:
        self.tell(f"-{group}")


def guard(pipe: int) -> None:
    """The guardian's work: read `+group name` / `-group` lines until the pipe closes; then
    give the groups still registered STOP_GRACE_SECONDS and kill what is left of them."""
    groups: dict[int, str] = {}
    pending = b""
    while chunk := os.read(pipe, 4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            number, _, name = line[1:].decode().partition(" ")
            if line.startswith(b"+"):
                groups[int(number)] = name
            else:
                groups.pop(int(number), None)
    if not groups:
        return  # serve stopped its children itself
    log(f"died without stopping {', '.join(groups.values())}; stopping them")
    if sys.platform != "linux":  # on Linux the parent-death signal has told them already
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.kill(group, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline:
        groups = {group: name for group, name in groups.items() if _group_alive(group)}
        if not groups:
            return
        time.sleep(POLL_SECONDS)
    for group, name in groups.items():
        log(f"{name} (process group {group}) did not stop in {STOP_GRACE_SECONDS:g} s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


class Child:
    """One command in its own process group, restarted with exponential backoff when it dies."""

    def __init__(
        self, name: str, command: list[str], can_start: Callable[[], str | None] | None = None
    ) -> None:
        self.name = name
        self.command = command
        #: Asked before each restart: a reason it can never start now, or None to start it.
        self.can_start = can_start
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.quick_deaths = 0
        self.restart_at: float | None = None
        self.guardian = Guardian()

    def start(self) -> None:
        # Its own group, so one killpg reaches the pool processes of a worker or gunicorn too;
        # and told to stop if serve itself is killed (no Ctrl-C reaches a group of its own).
        self.proc = subprocess.Popen(
            self.command, start_new_session=True, preexec_fn=_stop_with_parent
        )
        self.guardian.started(self.proc.pid, self.name)
        self.started_at = time.monotonic()
        self.restart_at = None

    def tend(self, now: float) -> str | None:
        """Restart the child when its backoff is over; notice (and log) when it has died. The
        reason it cannot be restarted, if `can_start` gives one."""
        if self.proc is None:
            return None
        if self.restart_at is not None:
            if now >= self.restart_at:
                reason = self.can_start() if self.can_start is not None else None
                if reason is not None:
                    return f"{self.name} cannot be restarted: {reason}"
                self.start()
                log(f"{self.name} restarted (pid {self.proc.pid})")
            return None
        code = self.proc.poll()
        if code is None:
            return None
        # A dead leader leaves its pool processes behind; they would hold the port or the queue.
        self.kill_group()
        self.guardian.stopped(self.proc.pid)
        if now - self.started_at >= STABLE_SECONDS:
            self.quick_deaths = 0
        delay = min(RESTART_MAX_SECONDS, RESTART_FIRST_SECONDS * 2**self.quick_deaths)
        self.quick_deaths += 1
        self.restart_at = now + delay
        log(f"{self.name} (pid {self.proc.pid}) {describe_exit(code)}; restarting in {delay:g} s")
        return None

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
        self.guardian.stopped(self.proc.pid)

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
        self.guardian = Guardian()
        for child in children:
            child.guardian = self.guardian

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def run(self) -> str | None:
        """Until asked to stop (None), or until a child cannot be restarted (the reason)."""
        # Handlers first: a Ctrl-C that lands while the children start still stops them all.
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        self.guardian.start()
        failure = None
        try:
            for child in self.children:
                child.start()
            while not self.stopping and failure is None:
                now = time.monotonic()
                for child in self.children:
                    failure = failure or child.tend(now)
                time.sleep(POLL_SECONDS)
            if failure is not None:
                log(f"{failure}; stopping everything")
            return failure
        finally:
            for child in self.children:
                child.terminate()
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for child in self.children:
                child.wait_or_kill(deadline)
            self.guardian.close()


if os.name != "posix":  # pragma: no cover - the service targets Linux and macOS
    raise ImportError("serve needs a POSIX system")
