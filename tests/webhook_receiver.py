"""A webhook receiver on 127.0.0.1 for tests and local trials: it verifies signatures the way
docs/alerts.md tells receivers to, and records what it got.

    python -m tests.webhook_receiver --port 9000 --secret <the channel's secret>

(the sender needs ALERTS_ALLOW_LOOPBACK=true, a setting for local testing only).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Reject signatures older than this: a captured request cannot be replayed later.
TOLERANCE_SECONDS = 300


def verify_signature(
    secret: str, body: bytes, timestamp: str, signature: str, now: float | None = None
) -> bool:
    """True when `signature` is HMAC-SHA256(secret, "<timestamp>.<body>") and recent."""
    if not timestamp.isdigit():
        return False
    if abs((now if now is not None else time.time()) - int(timestamp)) > TOLERANCE_SECONDS:
        return False
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest(f"sha256={expected.hexdigest()}", signature)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    signed: bool
    answered: bool = False

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class ReceiverState:
    secret: str = ""
    #: Status codes to answer with, in order; 200 once they run out.
    statuses: list[int] = field(default_factory=list)
    #: The first this-many requests wait for `release` before answering (a slow receiver).
    stall_first: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    stalled: threading.Event = field(default_factory=threading.Event)
    received: list[Received] = field(default_factory=list)
    #: Where a request is redirected: {path: location}.
    redirects: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        signed = verify_signature(
            state.secret,
            body,
            self.headers.get("X-CacheSafe-Timestamp", ""),
            self.headers.get("X-CacheSafe-Signature", ""),
        )
        entry = Received(self.path, dict(self.headers.items()), body, signed)
        with state.lock:
            state.received.append(entry)
            stall = len(state.received) <= state.stall_first
            status = state.statuses.pop(0) if state.statuses else 200
        if stall:
            state.stalled.set()
            state.release.wait(60)
            return  # the sender is gone by now: close without an answer
        if self.path in state.redirects:
            self.send_response(307)
            self.send_header("Location", state.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        answer = b"ok" if status < 300 else b"no"
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        self.wfile.flush()
        entry.answered = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: ReceiverState, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.state = state


class WebhookReceiver:
    """`WebhookReceiver(secret).start()`; `.url`, `.received`, `.stop()`."""

    def __init__(self, secret: str = "", port: int = 0) -> None:
        self.state = ReceiverState(secret=secret)
        self.server = _Server(self.state, port)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> WebhookReceiver:
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.state.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def received(self) -> list[Received]:
        with self.state.lock:
            return list(self.state.received)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--secret", default="")
    args = parser.parse_args()
    receiver = WebhookReceiver(args.secret, args.port)
    print(f"listening on {receiver.url}")
    seen = 0
    receiver.start()
    try:
        while True:
            time.sleep(0.5)
            for entry in receiver.received[seen:]:
                mark = "signed" if entry.signed else "NOT SIGNED (or wrong secret)"
                print(f"{entry.path} {mark}: {entry.body[:500].decode(errors='replace')}")
            seen = len(receiver.received)
    except KeyboardInterrupt:
        receiver.stop()


if __name__ == "__main__":
    main()
