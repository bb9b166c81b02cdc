"""`python -m checks proxy --upstream URL`: a recording proxy in front of an OpenAI-compatible
server that says, for every chat request, why the prompt cache kept or lost its prefix.

Requests and answers pass through unchanged (streaming included: chunks are relayed as they
arrive). Chat requests are grouped into conversations (the earlier request sharing the most
leading messages); each is diagnosed against the previous request of its conversation
(`checks.diagnose`: rendered in the sandbox when `--template` is given, the client's side only
otherwise), beside the upstream's own cache figures (`usage.prompt_tokens_details.cached_tokens`,
llama.cpp's `timings.cache_n`) and the time to the first byte of the answer. One line per request
is printed and, with `--log`, appended as JSON Lines. Authorization headers are never logged;
request bodies only with `--keep-bodies`.

Standard library HTTP server (threads) and `httpx2` for the upstream: nothing to install beyond
what huggingface_hub already brings.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import queue
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, BinaryIO
from urllib.parse import urlsplit

from checks.diagnose import (
    HINTS,
    NONE,
    ClientRequest,
    RequestError,
    client_change,
    load_json,
    parse_body,
)

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}
#: Bytes of an answer kept to read its usage (streams put it in the last events).
ANSWER_TAIL = 256 * 1024
MAX_BODY = 32 * 1024 * 1024
#: Conversations followed at once: the least recently continued one is let go beyond this.
MAX_CONVERSATIONS = 1000


@dataclass
class Conversation:
    """A conversation as the proxy follows it: its number, its last request and how many it
    has seen (the last is all a diagnosis compares: keeping every request grew the proxy by
    each body it relayed, for as long as it ran)."""

    number: int
    last: ClientRequest
    seen: int = 1


class Recorder:
    """Groups requests into conversations and diagnoses each against its predecessor."""

    def __init__(self, template: Any | None, tokenizer_json: str | None, pool: Any | None) -> None:
        self.template = template
        self.tokenizer_json = tokenizer_json
        self.pool = pool
        self.conversations: list[Conversation] = []
        self.opened = 0
        self.lock = threading.Lock()

    def place(self, request: ClientRequest) -> tuple[Conversation, ClientRequest | None]:
        """The conversation of `request`, and the request it follows: the conversation whose
        last request shares the most leading messages past the system prompt, else (a trimmed
        or edited history) the most messages anywhere, at least two; else a new one."""
        new = [m for m in request.messages if m.get("role") not in ("system", "developer")]
        with self.lock:
            best, score_best = None, (0, 0)
            for conversation in self.conversations:
                old = [
                    m
                    for m in conversation.last.messages
                    if m.get("role") not in ("system", "developer")
                ]
                leading = 0
                for a, b in zip(old, new, strict=False):
                    if a != b:
                        break
                    leading += 1
                overlap = sum(1 for m in new if m in old)
                score = (leading, overlap)
                if (leading >= 1 or overlap >= 2) and score >= score_best:
                    best, score_best = conversation, score
            if best is None:
                self.opened += 1
                best = Conversation(self.opened, request)
                self.conversations.append(best)
                if len(self.conversations) > MAX_CONVERSATIONS:
                    del self.conversations[0]  # the least recently continued
                return best, None
            self.conversations.remove(best)
            self.conversations.append(best)
            previous = best.last
            best.last, best.seen = request, best.seen + 1
            return best, previous

    def diagnose(
        self, previous: ClientRequest | None, request: ClientRequest, number: int = 2
    ) -> dict[str, Any]:
        """Request `number` of its conversation against the one before it."""
        if previous is None:
            return {"cause": "first", "prompt_reuse": None, "hint": "", "detail": "first request"}
        if self.template is not None:
            from checks import diagnose_requests
            from checks.sandbox import SandboxError

            try:
                (pair,) = diagnose_requests(
                    self.template,
                    [previous, request],
                    pool=self.pool,
                    tokenizer_json=self.tokenizer_json,
                )
            except SandboxError as exc:
                # Diagnosed as a pair of two: say the conversation's own numbers.
                said = re.sub(
                    r"^request ([12]):",
                    lambda found: f"request {number - 2 + int(found.group(1))}:",
                    str(exc),
                )
                return {"cause": "error", "prompt_reuse": None, "hint": "", "detail": said}
            return {**pair, "from": number - 1, "to": number}
        change = client_change(previous, request)
        if change is None:
            return {
                "cause": NONE,
                "prompt_reuse": None,
                "hint": "",
                "detail": "the messages extend the previous request (no --template: the "
                "template's side is not checked)",
            }
        return {
            "cause": change.cause,
            "prompt_reuse": None,
            "hint": HINTS[change.cause],
            "detail": change.detail,
            "where": {"message": change.message, "field": change.field, "offset": change.offset},
        }


def _count(value: Any) -> int | None:
    """A token count as an upstream writes it (an integer, or a float of one); None for
    anything else ("abc", a list, NaN, 1e999), which a server should not send and which must
    not cost the request its diagnosis."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and 0 <= value < 2**53:
        return int(value)
    return None


def cache_figures(answer: bytes) -> dict[str, int | None]:
    """The upstream's own reuse figures from a JSON answer or the events of a stream."""
    found: dict[str, int | None] = {"cached_tokens": None, "prompt_tokens": None}
    candidates: list[Any] = []
    text = answer.decode("utf-8", "replace")
    try:
        candidates.append(load_json(text))
    except json.JSONDecodeError:
        for line in text.splitlines():
            if line.startswith("data:"):
                payload = line[5:].strip()
                if payload and payload != "[DONE]":
                    try:
                        candidates.append(load_json(payload))
                    except json.JSONDecodeError:
                        continue
    for event in candidates:
        if not isinstance(event, dict):
            continue
        usage = event.get("usage") or {}
        message = event.get("message")
        if not usage and isinstance(message, dict):  # Anthropic's stream: in message_start
            usage = message.get("usage") or {}
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
                found["cached_tokens"] = _count(details["cached_tokens"])
            if _count(usage.get("prompt_tokens")) is not None:
                found["prompt_tokens"] = _count(usage["prompt_tokens"])
            if _count(usage.get("cache_read_input_tokens")) is not None:  # Anthropic's field
                found["cached_tokens"] = _count(usage["cache_read_input_tokens"])
        timings = event.get("timings") or {}
        if isinstance(timings, dict) and _count(timings.get("cache_n")) is not None:  # llama.cpp
            cached = _count(timings["cache_n"])
            found["cached_tokens"] = cached
            prompt = _count(timings.get("prompt_n"))
            if prompt is not None and cached is not None:
                found["prompt_tokens"] = prompt + cached
    return found


class BodyError(ValueError):
    """A request body the proxy cannot read: the status to answer and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def read_chunked(stream: BinaryIO | io.BufferedIOBase, most: int) -> bytes:
    """A body sent with `Transfer-Encoding: chunked` (curl's for a piped file; some clients'
    for every body), whole: relayed with a length, and recorded like any other."""
    body = bytearray()
    while True:
        line = stream.readline(1024)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BodyError(400, "a chunk of the body has no readable size") from None
        if size < 0:
            raise BodyError(400, "a chunk of the body has no readable size")
        if size == 0:
            while stream.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailers: nothing here needs them
            return bytes(body)
        if len(body) + size > most:
            raise BodyError(413, f"request body over {most} bytes")
        chunk = stream.read(size)
        if len(chunk) < size:
            raise BodyError(400, "the body ended inside a chunk")
        body.extend(chunk)
        stream.readline(1024)  # the CRLF after the chunk


#: Seconds the proxy waits for the upstream's next bytes (`--upstream-timeout`): its first
#: byte comes after the prompt's prefill, which a large model on a long prompt takes minutes for.
UPSTREAM_TIMEOUT = 600.0


def make_handler(
    upstream: str,
    recorder: Recorder,
    out: IO[str],
    log: IO[str] | None,
    keep_bodies: bool,
    upstream_timeout: float = UPSTREAM_TIMEOUT,
) -> type[BaseHTTPRequestHandler]:
    import httpx2

    client = httpx2.Client(timeout=httpx2.Timeout(upstream_timeout, connect=10.0))
    # Diagnoses run on one background thread, in arrival order: the answer is never held up by
    # the sandbox, and the next request on a kept-alive connection does not wait for it.
    # An item is a request to record (with why its answer was cut off, if it was), or a
    # failure of the relay to report (its path and what).
    backlog: queue.Queue[tuple[str, bytes, bytes, int, float | None, str] | tuple[str, str]]
    backlog = queue.Queue()

    def recorder_loop() -> None:
        while True:
            item = backlog.get()
            path = item[0]
            try:
                if len(item) == 2:
                    entry: dict[str, Any] = {"path": path, "status": 502, "failed": item[1]}
                else:
                    _, body, answer, status, ttft, cut = item
                    entry = record(recorder, path, body, answer, status, ttft, keep_bodies, cut)
                out.write(line_for(entry) + "\n")
                out.flush()
                if log is not None:
                    line = json.dumps(entry, ensure_ascii=False)
                    # A lone surrogate (a body can escape one) written escaped, into any file.
                    log.write(line.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
                    log.flush()
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the rest
                out.write(f"{path}: could not record this request ({type(exc).__name__})\n")
            finally:
                backlog.task_done()

    threading.Thread(target=recorder_loop, name="proxy-recorder", daemon=True).start()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Relay each chunk as it comes: no Nagle delay on the way back to the client.
        disable_nagle_algorithm = True
        pending = backlog

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            return  # our own line per request instead of the access log

        def _fail(self, status: int, message: str) -> None:
            """An error of the proxy's own, as JSON in the shape OpenAI clients read."""
            data = json.dumps({"error": {"message": message, "type": "proxy_error"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def _body(self) -> bytes:
            """The request's body, sent with a length or in chunks; BodyError if unreadable."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return read_chunked(self.rfile, MAX_BODY)
            given = (self.headers.get("Content-Length") or "0").strip()
            if not (given.isascii() and given.isdigit()):  # ("²" is a digit to isdigit)
                raise BodyError(400, f"Content-Length is not a length: {given[:40]!r}")
            length = int(given)
            if length > MAX_BODY:
                raise BodyError(413, f"request body over {MAX_BODY} bytes")
            body = self.rfile.read(length) if length else b""
            if len(body) < length:
                raise BodyError(400, f"the body ended after {len(body)} of {length} bytes")
            return body

        def _relay(self) -> None:
            started = time.perf_counter()
            try:
                body = self._body()
            except BodyError as exc:
                self._fail(exc.status, str(exc))
                return
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"
            }
            tail = bytearray()
            first_byte: float | None = None
            answered = False
            cut = ""
            try:
                with client.stream(
                    self.command, upstream + self.path, headers=headers, content=body
                ) as answer:
                    # The upstream's own Server and Date headers go on: not a second pair.
                    self.send_response_only(answer.status_code)
                    # As bytes: a value past Latin-1 (UTF-8) goes on as sent, and a repeated
                    # header (Set-Cookie) stays repeated.
                    for raw_key, raw_value in answer.headers.raw:
                        key = raw_key.decode("latin-1")
                        if key.lower() not in HOP_BY_HOP:
                            self.send_header(key, raw_value.decode("latin-1"))
                    # HEAD, 1xx, 204 and 304 answers have no body: no chunked framing either.
                    bodiless = (
                        self.command == "HEAD"
                        or answer.status_code in (204, 304)
                        or (answer.status_code < 200)
                    )
                    # An HTTP/1.0 client reads no chunked framing: its body is the bytes up to
                    # the connection's close.
                    chunked = not bodiless and self.request_version != "HTTP/1.0"
                    if chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                    elif not bodiless:
                        self.send_header("Connection", "close")
                        self.close_connection = True
                    self.end_headers()
                    answered = True
                    for chunk in answer.iter_raw():
                        if bodiless:
                            continue
                        if not chunk:
                            continue
                        if first_byte is None:
                            first_byte = time.perf_counter()
                        if chunked:
                            chunk_framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                            self.wfile.write(chunk_framed)
                        else:
                            self.wfile.write(chunk)
                        self.wfile.flush()
                        tail.extend(chunk)
                        if len(tail) > ANSWER_TAIL:
                            del tail[: len(tail) - ANSWER_TAIL]
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    status = answer.status_code
            except (httpx2.InvalidURL, UnicodeEncodeError, ValueError) as exc:
                if answered:
                    raise  # (none of these comes once the upstream answered)
                # What cannot be sent on as it came: an absolute-form target ("GET http://…",
                # as to an HTTP proxy), a header of text past Latin-1, a control character.
                self._fail(400, f"cannot relay this request: {type(exc).__name__}: {exc}"[:300])
                return
            except (BrokenPipeError, ConnectionResetError):
                # The client left mid-answer (a cancelled stream): what was asked is recorded.
                self.close_connection = True
                status = answer.status_code if answered else 499
            except httpx2.HTTPError as exc:
                timed_out = isinstance(exc, httpx2.ReadTimeout)
                if not answered:
                    said = f"upstream {upstream} unreachable: {type(exc).__name__}"
                    if timed_out:
                        said = (
                            f"upstream {upstream} sent nothing for {upstream_timeout:g} s "
                            "(--upstream-timeout)"
                        )
                    self._fail(504 if timed_out else 502, said)
                    backlog.put((self.path, said))
                    return
                # Cut off mid-answer (its connection dropped, a chunk it could not frame, a
                # stall): the client's body is left unended, so it sees the cut, and the
                # connection closed. The server took the request and began answering, so it
                # prefilled that prompt: recorded as its conversation's last request.
                self.close_connection = True
                status = answer.status_code
                cut = (
                    f"nothing more from {upstream} for {upstream_timeout:g} s (--upstream-timeout)"
                    if timed_out
                    else f"{type(exc).__name__} from {upstream}"
                )
            if self.command == "POST" and urlsplit(self.path).path.rstrip("/").endswith(
                ("/chat/completions", "/messages")
            ):
                ttft = None if first_byte is None else (first_byte - started) * 1000
                backlog.put((self.path, body, bytes(tail), status, ttft, cut))
            elif cut:
                backlog.put((self.path, f"answer cut off ({cut})"))

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _relay  # noqa: N815

    return Handler


def record(
    recorder: Recorder,
    path: str,
    body: bytes,
    answer: bytes,
    status: int,
    ttft: float | None,
    keep_bodies: bool,
    cut: str = "",
) -> dict[str, Any]:
    """The log entry of one chat request: its conversation, diagnosis and the cache figures;
    `cut` says why its answer ended early, if it did."""
    try:
        parsed = load_json(body or b"null")
        request = parse_body(parsed, "request")
    except (RequestError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return {"path": path, "status": status, "error": str(exc)}
    conversation, previous = recorder.place(request)
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "path": path,
        "status": status,
        "conversation": conversation.number,
        "request": conversation.seen,
        "diagnosis": recorder.diagnose(previous, request, conversation.seen),
        **cache_figures(answer),
        "ttft_ms": None if ttft is None else round(ttft, 1),
    }
    if cut:
        entry["cut"] = cut
    if keep_bodies:
        entry["body"] = parsed
    return entry


def line_for(entry: dict[str, Any]) -> str:
    if "failed" in entry:
        return f"{entry['path']}: {entry['failed']}"
    if "error" in entry:
        return f"{entry['path']}: not a chat request we can read ({entry['error']})"
    diagnosis = entry["diagnosis"]
    head = f"[conversation {entry['conversation']} request {entry['request']}]"
    parts = [diagnosis["cause"]]
    if diagnosis.get("prompt_reuse") is not None:
        parts.append(f"prompt reuse {round(diagnosis['prompt_reuse'] * 100)}%")
    if entry.get("cached_tokens") is not None:
        total = entry.get("prompt_tokens")
        parts.append(f"server cached {entry['cached_tokens']}" + (f"/{total}" if total else ""))
    if entry.get("ttft_ms") is not None:
        parts.append(f"first byte {entry['ttft_ms']:.0f} ms")
    if entry.get("cut"):
        parts.append(f"answer cut off ({entry['cut']})")
    line = f"{head} " + " · ".join(parts)
    if diagnosis["cause"] not in (NONE, "first"):
        line += f" — {diagnosis['detail']}. {diagnosis.get('hint', '')}".rstrip()
    return line


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m checks proxy",
        description="Pass an OpenAI-compatible API through and say, per chat request, why the "
        "prompt cache kept or lost its prefix.",
    )
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "--listen", default="127.0.0.1:8099", help="HOST:PORT (default %(default)s)"
    )
    parser.add_argument(
        "--template", type=Path, help="the served model's template: render-level causes"
    )
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json: reuse counted in tokens")
    parser.add_argument("--log", type=Path, help="append one JSON line per request here")
    parser.add_argument(
        "--keep-bodies", action="store_true", help="also log request bodies (off by default)"
    )
    parser.add_argument(
        "--upstream-timeout",
        type=float,
        default=UPSTREAM_TIMEOUT,
        metavar="SECONDS",
        help="wait at most this long for the upstream's next bytes, its first included "
        "(default %(default)g: a long prompt's prefill on a large model takes minutes)",
    )
    return parser


def serve(
    upstream: str,
    listen: tuple[str, int],
    *,
    template: Any | None = None,
    tokenizer_json: str | None = None,
    out: IO[str] | None = None,
    log: IO[str] | None = None,
    keep_bodies: bool = False,
    pool: Any | None = None,
    upstream_timeout: float = UPSTREAM_TIMEOUT,
) -> ThreadingHTTPServer:
    """A started proxy server (not yet serving: call `serve_forever`, or use `start`)."""
    recorder = Recorder(template, tokenizer_json, pool)
    handler = make_handler(
        upstream.rstrip("/"), recorder, out or sys.stdout, log, keep_bodies, upstream_timeout
    )
    server = ThreadingHTTPServer(listen, handler)
    server.daemon_threads = True
    return server


def drain(server: ThreadingHTTPServer) -> None:
    """Wait until every request seen so far is diagnosed and written (tests, shutdown)."""
    handler: Any = server.RequestHandlerClass
    handler.pending.join()


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        sys.stderr.write("python -m checks proxy: error: --listen must be HOST:PORT\n")
        return 2
    if not (math.isfinite(args.upstream_timeout) and args.upstream_timeout > 0):
        sys.stderr.write("python -m checks proxy: error: --upstream-timeout must be over 0\n")
        return 2
    import httpx2

    try:
        target = httpx2.URL(args.upstream)
    except (httpx2.InvalidURL, ValueError) as exc:
        target = None
        why = str(exc)
    if target is None or target.scheme not in ("http", "https") or not target.host:
        why = why if target is None else "an http or https URL with a host"
        sys.stderr.write(f"python -m checks proxy: error: --upstream: {why}\n")
        return 2
    template = tokenizer_json = None
    if args.template is not None:
        from checks.cli_diagnose import UsageError, load_template

        try:
            template, tokenizer_json = load_template(args.template, args.tokenizer)
        except UsageError as exc:
            sys.stderr.write(f"python -m checks proxy: error: {exc}\n")
            return 2
    try:
        log = args.log.open("a", encoding="utf-8") if args.log else None
    except OSError as exc:
        sys.stderr.write(f"python -m checks proxy: error: cannot write --log: {exc}\n")
        return 2
    try:
        server = serve(
            args.upstream,
            (host or "127.0.0.1", int(port)),
            template=template,
            tokenizer_json=tokenizer_json,
            log=log,
            keep_bodies=args.keep_bodies,
            upstream_timeout=args.upstream_timeout,
        )
    except OSError as exc:
        sys.stderr.write(f"python -m checks proxy: error: cannot listen on {args.listen}: {exc}\n")
        return 2
    sys.stdout.write(f"proxy on http://{args.listen} → {args.upstream}\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        drain(server)
        server.server_close()
        if log is not None:
            log.close()
    return 0
