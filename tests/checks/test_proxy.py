"""`python -m checks proxy`: in front of a stub upstream, and of a real mlx_lm.server."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import httpx2
import pytest

from checks import SandboxPool, TemplateSource
from checks.diagnose import parse_body
from checks.proxy import MAX_CONVERSATIONS, Recorder, cache_figures, drain, serve
from tests.diagnose_cases import PLAIN, conversation

STUB_ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Answer."}}],
    "usage": {
        "prompt_tokens": 20,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 7},
    },
}


class Stub(BaseHTTPRequestHandler):
    """An OpenAI-compatible server: a JSON answer, or three SSE events (usage in the last)."""

    protocol_version = "HTTP/1.1"
    seen_headers: list[dict[str, str]] = []

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def do_POST(self) -> None:  # noqa: N802
        try:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        except (ValueError, RecursionError):
            self.send_error(400)
            return
        Stub.seen_headers.append(dict(self.headers))
        if body.get("stream"):
            events = [
                {"choices": [{"delta": {"content": "Ans"}}]},
                {"choices": [{"delta": {"content": "wer."}}]},
                {"choices": [], "usage": STUB_ANSWER["usage"]},
            ]
            payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            data = payload.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
        else:
            data = json.dumps(STUB_ANSWER).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def started(server: ThreadingHTTPServer) -> str:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


@pytest.fixture
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    yield started(server)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    pool = SandboxPool(size=1)
    yield pool
    pool.close()


def proxy_with_template(
    upstream: str, out: IO[str], log: IO[str], pool: SandboxPool, *, keep_bodies: bool = False
) -> ThreadingHTTPServer:
    """A proxy on a free port in front of `upstream`, diagnosing with PLAIN."""
    return serve(
        upstream,
        ("127.0.0.1", 0),
        template=TemplateSource({"default": PLAIN}),
        out=out,
        log=log,
        pool=pool,
        keep_bodies=keep_bodies,
    )


def test_every_request_gets_a_diagnosis_and_the_servers_cache_figure(
    stub: str, pool: SandboxPool, tmp_path: Path
) -> None:
    out, log_path = io.StringIO(), tmp_path / "proxy.jsonl"
    with log_path.open("a") as log:
        proxy = proxy_with_template(stub, out, log, pool)
        base = started(proxy)
        bodies = conversation()
        bodies[1]["messages"][0]["content"] += " cwd=/home/a"  # a volatile system prompt
        bodies[2]["stream"] = True
        answers = []
        with httpx2.Client() as client:
            for body in bodies:
                answer = client.post(
                    base + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": "Bearer sk-secret-token"},
                )
                answers.append(answer)
        drain(proxy)
        proxy.shutdown()
        proxy.server_close()
    # Passed through unchanged, streaming included, and the credentials reached the upstream.
    assert answers[0].json() == STUB_ANSWER
    assert answers[2].text.count("data: ") == 4 and answers[2].text.endswith("[DONE]\n\n")
    assert Stub.seen_headers[-1]["Authorization"] == "Bearer sk-secret-token"
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[conversation 1 request 1] first")
    assert "system_changed" in lines[1] and "server cached 7/20" in lines[1]
    assert "keep it byte-identical" in lines[1]
    # Request 3 goes back to request 2's system prompt: a change again, found in the stream.
    assert "system_changed" in lines[2] and "server cached 7/20" in lines[2]
    entries = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [e["diagnosis"]["cause"] for e in entries] == [
        "first",
        "system_changed",
        "system_changed",
    ]
    assert all(e["ttft_ms"] is not None and e["cached_tokens"] == 7 for e in entries)
    logged = log_path.read_text()
    assert "sk-secret-token" not in logged  # never the credentials
    assert "List the files." not in logged  # no bodies unless asked


def test_separate_conversations_are_told_apart(stub: str, pool: SandboxPool) -> None:
    out = io.StringIO()
    proxy = serve(stub, ("127.0.0.1", 0), out=out, pool=pool)  # no template: client side only
    base = started(proxy)
    other = conversation()
    for body in other:
        body["messages"][1]["content"] = "A different task."
    with httpx2.Client() as client:
        for body in [conversation()[0], other[0], conversation()[1], other[1]]:
            client.post(base + "/v1/chat/completions", json=body)
    drain(proxy)
    proxy.shutdown()
    proxy.server_close()
    lines = out.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == [
        "[conversation 1 request 1",
        "[conversation 2 request 1",
        "[conversation 1 request 2",
        "[conversation 2 request 2",
    ]
    assert lines[2].startswith("[conversation 1 request 2] none")


@pytest.mark.probe
def test_in_front_of_a_real_mlx_lm_server(tmp_path: Path, pool: SandboxPool) -> None:
    """A tiny random-weight model behind mlx_lm.server: the proxy reports the server's own
    cached-token count beside the diagnosis."""
    from probe.server_path import running_server, warm_up
    from probe.tinymodels import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", "llama", "chatml").path
    template = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    out = io.StringIO()
    with running_server(model) as server:
        warm_up(server)
        proxy = serve(
            server.url,
            ("127.0.0.1", 0),
            template=TemplateSource({"default": template}),
            out=out,
            pool=pool,
        )
        base = started(proxy)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You answer briefly. " * 20},
            {"role": "user", "content": "Hello there."},
        ]
        with httpx2.Client(timeout=120) as client:
            for turn in range(2):
                answer = client.post(
                    base + "/v1/chat/completions",
                    json={"messages": messages, "max_tokens": 4, "temperature": 0.0},
                )
                assert answer.status_code == 200, answer.text
                reply = answer.json()["choices"][0]["message"]["content"]
                messages = [
                    *messages,
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"And then {turn}?"},
                ]
        drain(proxy)
        proxy.shutdown()
        proxy.server_close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, out.getvalue()
    assert "first" in lines[0]
    assert "] none ·" in lines[1] and "server cached " in lines[1]
    cached = int(lines[1].split("server cached ")[1].split("/")[0])
    assert cached > 0  # the server reused the previous turn's prefix


def test_a_body_nested_too_deeply_is_reported_and_the_next_still_diagnosed(
    stub: str, pool: SandboxPool
) -> None:
    out = io.StringIO()
    proxy = serve(
        stub, ("127.0.0.1", 0), template=TemplateSource({"default": PLAIN}), out=out, pool=pool
    )
    base = started(proxy)
    with httpx2.Client() as client:
        deep = client.post(
            base + "/v1/chat/completions",
            content=b"[" * 5000,
            headers={"Content-Type": "application/json"},
        )
        client.post(base + "/v1/chat/completions", json=conversation()[0])
    drain(proxy)
    proxy.shutdown()
    proxy.server_close()
    assert deep.status_code == 400  # the upstream's own answer, passed through
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "/v1/chat/completions: not a chat request we can read "
        "(nested too deeply: line 1 column 1 (char 0))"
    )
    assert lines[1].startswith("[conversation 1 request 1] first")


def test_a_chunked_body_and_the_conversations_own_numbers(stub: str, pool: SandboxPool) -> None:
    """A body sent in chunks reaches the upstream whole and is diagnosed; each pair is
    numbered as the conversation counts its requests, and the upstream's Server and Date
    headers are passed on once."""
    out, log = io.StringIO(), io.StringIO()
    proxy = proxy_with_template(stub, out, log, pool)
    base = started(proxy)
    bodies = conversation()
    with httpx2.Client() as client:
        for body in bodies:
            data = json.dumps(body).encode()
            answer = client.post(
                base + "/v1/chat/completions",
                content=iter([data[:10], data[10:]]),  # no length: sent in chunks
                headers={"Content-Type": "application/json"},
            )
            assert answer.json() == STUB_ANSWER
    drain(proxy)
    proxy.shutdown()
    proxy.server_close()
    entries = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [e["request"] for e in entries] == [1, 2, 3]
    assert [(e["diagnosis"].get("from"), e["diagnosis"].get("to")) for e in entries] == [
        (None, None),
        (1, 2),
        (2, 3),
    ]
    assert [k.lower() for k in answer.headers].count("server") <= 1
    assert [k.lower() for k in answer.headers].count("date") <= 1


def test_bad_bodies_and_a_dead_upstream_get_json_errors_and_a_line(pool: SandboxPool) -> None:
    """What an OpenAI client can read (JSON), and a line in the proxy's own output."""
    out = io.StringIO()
    dead = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    upstream = f"http://127.0.0.1:{dead.server_address[1]}"
    dead.server_close()  # nothing listens there any more
    proxy = serve(upstream, ("127.0.0.1", 0), out=out, pool=pool)
    base = started(proxy)
    with httpx2.Client() as client:
        gone = client.post(base + "/v1/chat/completions", json=conversation()[0])
    # A length that is not one (no HTTP client library sends that: a socket does).
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"
        )
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    drain(proxy)
    proxy.shutdown()
    proxy.server_close()
    assert gone.status_code == 502
    assert "unreachable" in gone.json()["error"]["message"]
    assert head.startswith(b"HTTP/1.1 400 ")
    assert "Content-Length is not a length" in json.loads(payload)["error"]["message"]
    assert f"/v1/chat/completions: upstream {upstream} unreachable: ConnectError" in out.getvalue()


def raw_request(base: str, request: bytes, *, half_close: bool = False) -> bytes:
    """`request` written to the proxy on a socket of its own (what no client library sends),
    and whatever it answers until it hangs up."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(request)
        if half_close:
            raw.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize(
    ("request_bytes", "status", "said"),
    [
        # The absolute form, as a client configured to use the proxy as an HTTP proxy sends.
        (b"GET http://127.0.0.1:9/v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 400, "cannot relay"),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Title: caf\xc3\xa9\r\n"
            b"Content-Length: 2\r\n\r\n{}",
            400,
            "cannot relay",
        ),
        # "²" is a digit to str.isdigit, not to int.
        (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: \xc2\xb2\r\n\r\n{}",
            400,
            "Content-Length is not a length",
        ),
    ],
)
def test_what_cannot_be_relayed_gets_a_json_error_not_a_dropped_connection(
    stub: str, pool: SandboxPool, request_bytes: bytes, status: int, said: str
) -> None:
    proxy = serve(stub, ("127.0.0.1", 0), out=io.StringIO(), pool=pool)
    base = started(proxy)
    head, _, payload = raw_request(base, request_bytes).partition(b"\r\n\r\n")
    proxy.shutdown()
    proxy.server_close()
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert said in json.loads(payload)["error"]["message"]


def test_a_body_shorter_than_its_length_is_refused_not_relayed_cut(
    stub: str, pool: SandboxPool
) -> None:
    proxy = serve(stub, ("127.0.0.1", 0), out=io.StringIO(), pool=pool)
    base = started(proxy)
    reply = raw_request(
        base,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
        + b'{"a": 1}',
        half_close=True,
    )
    proxy.shutdown()
    proxy.server_close()
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert "the body ended after 8 of 100 bytes" in json.loads(payload)["error"]["message"]
    assert not Stub.seen_headers or all(h.get("Content-Length") != "8" for h in Stub.seen_headers)


class Figures(BaseHTTPRequestHandler):
    """An upstream whose usage figures are not counts."""

    protocol_version = "HTTP/1.1"
    usage: dict[str, Any] = {}

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({**STUB_ANSWER, "usage": Figures.usage}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.mark.parametrize("cached", ["abc", [1], 1e300, -3, True])
def test_usage_figures_that_are_not_counts_cost_the_request_nothing(
    pool: SandboxPool, cached: Any
) -> None:
    Figures.usage = {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": cached}}
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Figures)
    out, log = io.StringIO(), io.StringIO()
    proxy = proxy_with_template(started(upstream), out, log, pool)
    base = started(proxy)
    with httpx2.Client() as client:
        for body in conversation()[:2]:
            client.post(base + "/v1/chat/completions", json=body)
    drain(proxy)
    for server in (proxy, upstream):
        server.shutdown()
        server.server_close()
    entries = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [e["request"] for e in entries] == [1, 2]
    assert all(e["cached_tokens"] is None and e["prompt_tokens"] == 10 for e in entries)
    assert "could not record" not in out.getvalue()


def test_a_client_that_leaves_mid_answer_is_still_recorded(pool: SandboxPool) -> None:
    """A cancelled stream: the proxy's write to the client fails, quietly, and what was asked
    is diagnosed all the same."""

    class Slow(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(40):
                    event = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
                    self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.05)
                self.wfile.write(b"0\r\n\r\n")

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    out, log = io.StringIO(), io.StringIO()
    proxy = proxy_with_template(started(upstream), out, log, pool)
    base = started(proxy)
    body = json.dumps({**conversation()[0], "stream": True}).encode()
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        raw.recv(1024)  # the answer has begun
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(0.5)  # the proxy writes on, to a socket that is gone
    drain(proxy)
    for server in (proxy, upstream):
        server.shutdown()
        server.server_close()
    [entry] = [json.loads(line) for line in log.getvalue().splitlines()]
    assert entry["request"] == 1 and entry["status"] == 200
    assert "could not record" not in out.getvalue()


def test_a_lone_surrogate_in_a_body_is_logged_escaped(stub: str, pool: SandboxPool) -> None:
    """A body can escape a lone surrogate ("\\ud800"); the log is written with such characters
    escaped, where a UTF-8 file (strict, as `--log` opens it) lost the request's line."""
    log_path = io.BytesIO()
    log = io.TextIOWrapper(log_path, encoding="utf-8")
    out = io.StringIO()
    proxy = proxy_with_template(stub, out, log, pool, keep_bodies=True)
    base = started(proxy)
    first, second = conversation()[:2]
    second = {
        **second,
        "messages": [{"role": "system", "content": "x \ud800"}, *second["messages"]],
    }
    with httpx2.Client() as client:
        client.post(base + "/v1/chat/completions", json=first)
        client.post(
            base + "/v1/chat/completions",
            content=json.dumps(second).encode(),
            headers={"Content-Type": "application/json"},
        )
    drain(proxy)
    proxy.shutdown()
    proxy.server_close()
    log.flush()
    lines = log_path.getvalue().decode("utf-8").splitlines()
    assert len(lines) == 2 and "x \\ud800" in lines[1]
    assert "could not record" not in out.getvalue()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--listen", "127.0.0.1:99999"], "--listen must be HOST:PORT"),
        (["--upstream", "http://[::1"], "--upstream"),
        (["--upstream", "ftp://example.test"], "an http or https URL with a host"),
        (["--log", "{tmp}"], "cannot write --log"),
        (["--log", "{tmp}/no/such/folder/x.jsonl"], "cannot write --log"),
        (["--upstream-timeout", "0"], "--upstream-timeout must be over 0"),
        (["--upstream-timeout", "nan"], "--upstream-timeout must be over 0"),
        (["--upstream-timeout", "soon"], "invalid float value"),
    ],
)
def test_a_proxy_that_cannot_start_says_why_and_exits_2(
    tmp_path: Path, args: list[str], said: str
) -> None:
    argv = ["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"]
    argv += [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    process = subprocess.run(
        [sys.executable, "-m", "checks", "proxy", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.returncode == 2, process.stderr
    assert said in process.stderr and "Traceback" not in process.stderr


def test_an_upstream_that_never_answers_is_a_504_after_the_upstream_timeout(
    pool: SandboxPool,
) -> None:
    """The wait for the upstream's bytes was 600 s, fixed: a server that took the request and
    hung held its client that long. It is `--upstream-timeout` now, and its end is a 504 that
    says so, to the client and in the proxy's output."""
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
    upstream = f"http://127.0.0.1:{silent.getsockname()[1]}"
    out = io.StringIO()
    proxy = serve(upstream, ("127.0.0.1", 0), out=out, pool=pool, upstream_timeout=0.5)
    base = started(proxy)
    try:
        with httpx2.Client(timeout=30) as client:
            answer = client.post(base + "/v1/chat/completions", json=conversation()[0])
        drain(proxy)
    finally:
        proxy.shutdown()
        proxy.server_close()
        for connection in held:
            connection.close()
        silent.close()
    assert answer.status_code == 504
    assert "sent nothing for 0.5 s" in answer.json()["error"]["message"]
    assert f"upstream {upstream} sent nothing for 0.5 s (--upstream-timeout)" in out.getvalue()


class Upstream(BaseHTTPRequestHandler):
    """A server with more than chat: 204s, HEAD, CORS preflights, a UTF-8 header."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def _read(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self, data: bytes, extra: bytes = b"") -> None:
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + extra
            + b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )

    def do_GET(self) -> None:  # noqa: N802
        self._json(b'{"object": "list", "data": []}')

    def do_HEAD(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "30")
        self.end_headers()

    def do_OPTIONS(self) -> None:  # noqa: N802
        self.send_response(204)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()

    def do_DELETE(self) -> None:  # noqa: N802
        self._read()
        self.send_response(204)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        self._read()
        extra = b"X-Model: \xe6\xa8\xa1\xe5\x9e\x8b\r\n" if "utf8" in self.path else b""
        self._json(b'{"choices": [], "usage": {"prompt_tokens": 5}}', extra)


@pytest.fixture
def proxied() -> Iterator[tuple[str, io.StringIO, ThreadingHTTPServer]]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    out = io.StringIO()
    proxy = serve(f"http://127.0.0.1:{upstream.server_address[1]}", ("127.0.0.1", 0), out=out)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{proxy.server_address[1]}", out, proxy
    proxy.shutdown()
    proxy.server_close()
    upstream.shutdown()
    upstream.server_close()


def test_a_204_answer_leaves_the_kept_alive_connection_usable(proxied: Any) -> None:
    base, _, _ = proxied
    with httpx2.Client() as client:
        assert client.delete(base + "/v1/files/x").status_code == 204
        # The same kept-alive connection: the 204 must not have been given a chunked body.
        assert client.get(base + "/v1/models").json() == {"object": "list", "data": []}


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
def test_head_and_options_pass_through(proxied: Any, method: str) -> None:
    """ "Every request passes through unchanged": a browser client's CORS preflight too."""
    base, _, _ = proxied
    with httpx2.Client() as client:
        answer = client.request(method, base + "/v1/chat/completions")
    assert answer.status_code != 501, answer.text[:200]


def test_an_upstream_header_in_utf8_is_relayed_not_turned_into_a_400(proxied: Any) -> None:
    base, out, proxy = proxied
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    with socket.create_connection(proxy.server_address[:2], timeout=5) as sock:
        sock.sendall(
            b"POST /utf8/v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.count(b"HTTP/1.1 ") == 1, raw.decode("latin-1")
    assert raw.startswith(b"HTTP/1.1 200"), raw.decode("latin-1")


def test_a_chat_request_with_a_query_string_is_diagnosed(proxied: Any) -> None:
    """Azure OpenAI clients add ?api-version=… to every chat request."""
    base, out, proxy = proxied
    body = {"messages": [{"role": "user", "content": "hi"}]}
    with httpx2.Client() as client:
        client.post(base + "/v1/chat/completions?api-version=2024-10-21", json=body)
    drain(proxy)
    assert "[conversation 1 request 1] first" in out.getvalue(), out.getvalue()


def test_an_anthropic_streams_cached_tokens_are_read() -> None:
    """Anthropic streams give the usage, cache_read_input_tokens included, in message_start."""
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "usage": {
                        "input_tokens": 25,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 1800,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"},
            },
        ),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 15},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    stream = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    assert cache_figures(stream.encode())["cached_tokens"] == 1800


def test_the_recorder_does_not_grow_with_unrelated_requests() -> None:
    """docs: "the proxy does not grow with the traffic it relays". One-shot requests (titles,
    summaries, a batch job) each open a conversation that is never let go."""
    recorder = Recorder(None, None, None)
    first = [{"role": "user", "content": "the conversation that goes on"}]
    kept, _ = recorder.place(parse_body({"messages": first}))
    for n in range(3000):
        recorder.place(parse_body({"messages": [{"role": "user", "content": f"summarize {n}"}]}))
        if n % 500 == 0:  # continued now and then: it is the most recent, and stays
            first += [{"role": "assistant", "content": f"a{n}"}, {"role": "user", "content": "q"}]
            again, previous = recorder.place(parse_body({"messages": first}))
            assert again is kept and previous is not None
    assert len(recorder.conversations) == MAX_CONVERSATIONS
    assert kept in recorder.conversations
    newest, _ = recorder.place(parse_body({"messages": [{"role": "user", "content": "new"}]}))
    assert newest.number == 3002  # numbered in order, whatever was let go


def test_an_http_1_0_client_gets_the_body_unframed(proxied: Any) -> None:
    """An HTTP/1.0 client (ApacheBench, some load balancers' health checks) reads no chunked
    framing: it got the chunk sizes in its body."""
    _, _, proxy = proxied
    with socket.create_connection(proxy.server_address[:2], timeout=5) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.0\r\nHost: x\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):  # the proxy closes the connection at the end
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower(), head
    assert json.loads(body) == {"object": "list", "data": []}


class BrokenOff(Stub):
    """An upstream that fails mid-answer: two SSE events, then its connection drops
    (`/dropped`), a chunk whose size is not one (`/garbled`) or a stall past the proxy's
    `--upstream-timeout` (`/stalled`), or a JSON answer shorter than its `Content-Length`
    (`/short`); any other path is the stub's."""

    EVENTS = [
        b'data: {"choices": [{"delta": {"content": "Ans"}}]}\n\n',
        b'data: {"choices": [], "usage": {"prompt_tokens": 20, '
        b'"prompt_tokens_details": {"cached_tokens": 7}}}\n\n',
    ]

    def do_POST(self) -> None:  # noqa: N802
        if not self.path.startswith(("/dropped/", "/garbled/", "/stalled/", "/short/")):
            super().do_POST()
            return
        self.rfile.read(int(self.headers["Content-Length"]))
        self.close_connection = True  # the upstream's connection drops at the end
        if self.path.startswith("/short/"):
            data = json.dumps(STUB_ANSWER).encode()
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(data), data[: len(data) // 2])
            )
            return
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for event in self.EVENTS:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        if self.path.startswith("/garbled/"):
            self.wfile.write(b"zz\r\ndata: {\r\n")
        if self.path.startswith("/stalled/"):
            time.sleep(2)


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        ("dropped", "RemoteProtocolError"),
        ("garbled", "RemoteProtocolError"),
        ("stalled", "nothing more from"),
        ("short", "RemoteProtocolError"),
    ],
)
def test_an_upstream_that_fails_mid_answer_is_relayed_cut_and_still_recorded(
    failure: str, said: str
) -> None:
    """The server received the request and began its answer, so it prefilled (and cached) that
    prompt: the next request of the conversation is diagnosed against it. The client gets what
    the upstream sent and a closed connection, not an answer that looks whole, nor a hang."""
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), BrokenOff)
    out, log = io.StringIO(), io.StringIO()
    proxy = serve(started(upstream), ("127.0.0.1", 0), out=out, log=log, upstream_timeout=0.5)
    base = started(proxy)
    first, second = conversation()[:2]
    body = json.dumps({**first, "stream": failure != "short"}).encode()
    reply = raw_request(
        base,
        f"POST /{failure}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n".encode()
        + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    with httpx2.Client(timeout=10) as client:
        after = client.post(base + "/v1/chat/completions", json=second)
    drain(proxy)
    for server in (proxy, upstream):
        server.shutdown()
        server.server_close()
    head, _, relayed = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"chunked" in head.lower()
    if failure == "short":
        assert json.dumps(STUB_ANSWER).encode()[:20] in relayed
    else:
        assert all(event in relayed for event in BrokenOff.EVENTS)
    assert not relayed.endswith(b"0\r\n\r\n")  # no end of body: the client sees it was cut
    assert after.json() == STUB_ANSWER  # the proxy goes on serving
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("[conversation 1 request 1] first")
    assert "answer cut off" in lines[0]
    assert lines[1].startswith("[conversation 1 request 2] none"), lines[1]
    entries = [json.loads(line) for line in log.getvalue().splitlines()]
    assert entries[0]["status"] == 200 and said in entries[0]["cut"]
    if failure != "short":  # the figures the stream sent before it broke off
        assert entries[0]["cached_tokens"] == 7
    assert "cut" not in entries[1]
