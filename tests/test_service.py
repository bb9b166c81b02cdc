"""`make run` as a user runs it: one process tree, embedded defaults, clean errors, Ctrl-C."""

from __future__ import annotations

import errno
import fcntl
import io
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from tests.conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.worker


def manage(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_serve_runs_web_worker_and_beat_and_stops_on_ctrl_c(embedded_env: dict[str, str]) -> None:
    port = free_port()
    embedded_env["PORT"] = str(port)
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve"],
        cwd=REPO_ROOT,
        env=embedded_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        health: dict[str, object] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                status, body = get(f"{base}/healthz")
            except OSError:
                time.sleep(0.5)
                continue
            health = json.loads(body)
            if status == 200:
                break
            time.sleep(1)
        assert health.get("status") == "ok", health
        assert health["worker"]["ok"] and health["beat"]["ok"]  # type: ignore[index]

        status, page = get(f"{base}/")
        assert status == 200
        assert b"cachesafe-demo/chatml-tools-7b" in page
        assert Path(embedded_env["CACHESAFE_VAR_DIR"], "cachesafe.sqlite3").is_file()
        # The demo was checked on start-up, and links name the port the server answers on.
        status, model_page = get(f"{base}/m/cachesafe-demo/marker-chat-8b/")
        assert status == 200
        assert b"Breaks the cache" in model_page
        assert f"{base}/m/cachesafe-demo/marker-chat-8b/at/".encode() in model_page
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the web server outlived Ctrl-C"


def test_taken_port_is_one_clear_line(embedded_env: dict[str, str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        embedded_env["PORT"] = str(sock.getsockname()[1])
        result = manage("serve", env=embedded_env)
    assert result.returncode != 0
    assert "already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_database_is_one_clear_line(embedded_env: dict[str, str]) -> None:
    embedded_env["PORT"] = str(free_port())
    embedded_env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{free_port()}/nowhere"
    result = manage("serve", env=embedded_env)
    assert result.returncode != 0
    assert "Cannot connect to the database 'nowhere'" in result.stderr
    assert "DATABASE_URL" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_broker_is_one_clear_line(embedded_env: dict[str, str]) -> None:
    embedded_env["PORT"] = str(free_port())
    embedded_env["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    result = manage("serve", env=embedded_env)
    assert result.returncode != 0
    assert "Cannot reach Redis" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_setting_is_one_clear_line(embedded_env: dict[str, str]) -> None:
    embedded_env["DATABASE_URL"] = "mysql://root@localhost/db"
    result = manage("check", env=embedded_env)
    assert result.returncode == 2
    assert result.stderr.startswith("configuration error: DATABASE_URL=")
    assert "Traceback" not in result.stderr


def test_production_guard_refuses_the_default_secret(embedded_env: dict[str, str]) -> None:
    embedded_env["DEBUG"] = "false"
    embedded_env.pop("SECRET_KEY", None)
    result = manage("check", env=embedded_env)
    assert result.returncode == 2
    assert "SECRET_KEY" in result.stderr and "Traceback" not in result.stderr

    embedded_env["SECRET_KEY"] = "x" * 50
    assert manage("check", env=embedded_env).returncode == 0


def test_a_second_serve_from_the_same_folder_is_one_clear_line(
    embedded_env: dict[str, str],
) -> None:
    """Started while the first still migrated, a second one passed the port check and ran a
    second worker and beat on the same database and broker: the folder is held instead."""
    var = Path(embedded_env["CACHESAFE_VAR_DIR"])
    var.mkdir(parents=True, exist_ok=True)
    with (var / "serve.lock").open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a first serve holds it
        embedded_env["PORT"] = str(free_port())
        result = manage("serve", env=embedded_env)
    assert result.returncode != 0
    assert f"CacheSafe is already running from {var}" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_port_whose_last_connection_waits_out_time_wait_is_free() -> None:
    """What a server that just stopped leaves (it closed its connections first): gunicorn
    binds there, so the check before it must not say the port is in use."""
    from cachesafe.management.commands.serve import check_port_free

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
            client.recv(1)
    check_port_free("127.0.0.1", port)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        with pytest.raises(CommandError, match="already in use"):
            check_port_free("127.0.0.1", listening.getsockname()[1])


def test_serve_logs_nothing_and_raises_nothing_once_its_terminal_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guardian logs before it stops what serve left: with the terminal closed, the write
    failed (EIO) and ended the guardian first."""
    from cachesafe.management.commands import serve

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(sys, "stderr", Gone())
    serve.log("died without stopping beat")  # no exception


def test_a_var_dir_that_cannot_hold_the_state_is_one_clear_line(
    embedded_env: dict[str, str], tmp_path: Path
) -> None:
    """A CACHESAFE_VAR_DIR that cannot be made (here under a file: what a read-only folder
    does, for a user other than root), and an embedded database that cannot be opened (here a
    folder by its name), each say which folder, in one line: a traceback before."""
    (tmp_path / "a-file").write_text("")
    embedded_env["CACHESAFE_VAR_DIR"] = str(tmp_path / "a-file" / "var")
    unmade = manage("check", env=embedded_env)
    assert unmade.returncode == 2
    assert unmade.stderr.startswith("configuration error: cannot create ")
    assert "CACHESAFE_VAR_DIR" in unmade.stderr and "Traceback" not in unmade.stderr

    var = tmp_path / "var"
    (var / "cachesafe.sqlite3").mkdir(parents=True)
    embedded_env["CACHESAFE_VAR_DIR"] = str(var)
    embedded_env["PORT"] = str(free_port())
    unopened = manage("serve", env=embedded_env)
    assert unopened.returncode != 0
    assert f"Is {var} read-only or full?" in unopened.stderr
    assert "DATABASE_URL" not in unopened.stderr and "Traceback" not in unopened.stderr
    assert len(unopened.stderr.strip().splitlines()) == 1
