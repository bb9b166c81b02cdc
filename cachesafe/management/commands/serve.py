"""`make run`: migrate, then run the web server, a Celery worker and beat in the foreground."""

from __future__ import annotations

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
    help = "Run CacheSafe locally: web server, Celery worker and beat, stopped together."

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
                "--bind", f"{host}:{port}", "--workers", "2", "--threads", "4",
                "--access-logfile", "-", "--graceful-timeout", "5",
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
        sys.exit(supervise(processes))


def supervise(commands: dict[str, list[str]]) -> int:
    """Run the commands until Ctrl-C/SIGTERM or until one exits; then stop them all."""
    children = {name: subprocess.Popen(cmd) for name, cmd in commands.items()}
    stopping = False

    def request_stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    exit_code = 0
    try:
        while not stopping:
            for name, child in children.items():
                code = child.poll()
                if code is not None:
                    print(f"{name} exited with code {code}; stopping the others", file=sys.stderr)
                    exit_code = code or 1
                    stopping = True
                    break
            time.sleep(0.3)
    finally:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return exit_code


if os.name != "posix":  # pragma: no cover - the service targets Linux and macOS
    raise ImportError("serve needs a POSIX system")
