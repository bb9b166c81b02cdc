"""Black-box probe: a real `mlx_lm.server` on 127.0.0.1, reuse read from `cached_tokens`.

Traps avoided (docs/probe.md): readiness is `GET /health` (`/v1/models` fails offline); one
warm-up request first, shaped so that it shares no prefix with any chat prompt; no `seed` (it
switches the server to its path without checkpoints); never a request whose tokens equal a
stored key (it kills the batched server's generation thread); the server is always stopped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.library_path import PREFILL_STEP_SIZE, PROMPT_CACHE_SIZE
from probe.rendering import ChatRequest

HOST = "127.0.0.1"


class ServerError(RuntimeError):
    """The server did not start, died, or answered something unusable."""


@dataclass(frozen=True)
class ServerTurn:
    """One request as the server answered it."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_ms: float  # time to the first streamed data chunk
    total_ms: float
    text: str


def free_port() -> int:
    """A port nothing listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    """A started server: its base URL and process."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False


@contextmanager
def running_server(
    model_dir: Path,
    *,
    startup_timeout_s: float = 120.0,
    prompt_cache_size: int = PROMPT_CACHE_SIZE,
    extra_args: list[str] | None = None,
) -> Iterator[RunningServer]:
    """Start `mlx_lm.server` on a free 127.0.0.1 port, wait for /health, always stop it."""
    port = free_port()
    fd, log_name = tempfile.mkstemp(prefix="mlx-server-", suffix=".log")
    log = os.fdopen(fd, "wb")
    cmd = [
        sys.executable,
        "-m",
        "mlx_lm",
        "server",
        "--model",
        str(model_dir),
        "--host",
        HOST,
        "--port",
        str(port),
        "--prompt-cache-size",
        str(prompt_cache_size),
        "--prefill-step-size",
        str(PREFILL_STEP_SIZE),
        "--log-level",
        "INFO",
        *(extra_args or []),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    process = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    server = RunningServer(f"http://{HOST}:{port}", process, Path(log_name))
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.healthy():
            if process.poll() is not None:
                raise ServerError(f"mlx_lm.server exited at startup: {server.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerError(f"mlx_lm.server not healthy after {startup_timeout_s:.0f} s")
            time.sleep(0.2)
        yield server
    finally:
        _stop(process)
        log.close()
        Path(log_name).unlink(missing_ok=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    # Its own session: the signal reaches the server and nothing else.
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def chat(
    server: RunningServer,
    request: ChatRequest,
    *,
    max_tokens: int,
    template_kwargs: dict[str, Any] | None = None,
    timeout_s: float = 600.0,
) -> ServerTurn:
    """One streamed, greedy chat completion; usage comes with the last chunk."""
    body: dict[str, Any] = {
        "messages": request.messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = request.tools
    if template_kwargs:
        body["chat_template_kwargs"] = template_kwargs
    return _post_stream(server, "/v1/chat/completions", body, timeout_s)


def warm_up(server: RunningServer) -> None:
    """The first request is ~2x slower; a plain completion shares no prefix with chat prompts."""
    body = {"prompt": "warm up", "max_tokens": 2, "temperature": 0.0, "stream": False}
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        server.url + "/v1/completions", data, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
    except (urllib.error.URLError, OSError) as exc:
        raise ServerError(f"warm-up request failed: {exc}; log: {server.log_tail()}") from exc


def _post_stream(
    server: RunningServer, path: str, body: dict[str, Any], timeout_s: float
) -> ServerTurn:
    data = json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data, {"Content-Type": "application/json"})
    tic = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] | None = None
    text = []
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for raw in r:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue  # SSE comments are the server's keepalive progress
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                if first is None:
                    first = time.perf_counter()
                chunk = json.loads(payload)
                for choice in chunk.get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
                usage = chunk.get("usage") or usage
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        healthy = server.healthy()
        raise ServerError(
            f"request failed ({exc}); server healthy: {healthy}; log: {server.log_tail()}"
        ) from exc
    end = time.perf_counter()
    if usage is None:
        raise ServerError("no usage in the stream (stream_options.include_usage ignored?)")
    details = usage.get("prompt_tokens_details") or {}
    return ServerTurn(
        prompt_tokens=int(usage["prompt_tokens"]),
        cached_tokens=int(details.get("cached_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        ttft_ms=round(((first or end) - tic) * 1000, 3),
        total_ms=round((end - tic) * 1000, 3),
        text="".join(text),
    )


def serve_conversation(
    model_dir: Path,
    requests: list[ChatRequest],
    *,
    max_tokens: int,
    template_kwargs: dict[str, Any] | None = None,
    startup_timeout_s: float = 120.0,
    prompt_cache_size: int = PROMPT_CACHE_SIZE,
) -> list[ServerTurn]:
    """Send a conversation's requests, then the last one again, to a fresh server."""
    with running_server(
        model_dir, startup_timeout_s=startup_timeout_s, prompt_cache_size=prompt_cache_size
    ) as server:
        warm_up(server)
        turns = [
            chat(server, r, max_tokens=max_tokens, template_kwargs=template_kwargs)
            for r in [*requests, requests[-1]]
        ]
        if not server.healthy():
            raise ServerError(f"server unhealthy after the conversation: {server.log_tail()}")
        return turns
