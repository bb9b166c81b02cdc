"""A fake Hugging Face Hub on 127.0.0.1, shaped like the endpoints huggingface_hub 2.x calls.

Served: model info (`/api/models/{id}[/revision/{rev}]`, `blobs=True` adds sizes and ids,
`expand` answers only the fields asked, `gguf` parsed from the main GGUF file as the Hub does),
list models (Link pagination, sorts by downloads, likes, trendingScore, lastModified; `filter`
tags), commits (Link pagination, newest first), tree, paths-info and file resolve at a revision,
with HTTP range requests (206, 416), and the headers and `X-Error-Code`s the client maps to its
errors.
Faults can be injected for the next N matching requests; every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from .store import FakeCommit, FakeRepo, RepoStore, blob_oid, is_lfs, tree_oid

PAGE_SIZE_COMMITS = 50  # what the real Hub returns per page of /commits
PAGE_SIZE_MODELS = 1000


@dataclass
class Fault:
    kind: str  # "404" (bare, no error code), "429", "500", "slow", "truncated"
    times: int
    match: str = ""  # substring of the request path; "" matches everything
    retry_after: int = 1
    delay: float = 0.0


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    repo_id: str | None
    status: int
    #: Body bytes sent (what a range request saves is counted, not assumed).
    sent: int = 0


@dataclass
class HubState:
    store: RepoStore = field(default_factory=RepoStore)
    faults: list[Fault] = field(default_factory=list)
    log: list[LoggedRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    commits_page_size: int = PAGE_SIZE_COMMITS
    models_page_size: int = PAGE_SIZE_MODELS
    #: Answer like a bare-bones Hub look-alike: no `X-Error-Code` headers, and model info
    #: without `sha` or file metadata (what a client cannot count on from every server).
    minimal: bool = False
    #: Seconds every request waits before it is answered: a network round trip to the Hub.
    latency: float = 0.0

    def take_fault(self, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.times > 0 and fault.match in path:
                    fault.times -= 1
                    return fault
        return None

    def record(self, entry: LoggedRequest) -> None:
        with self.lock:
            self.log.append(entry)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _file_entry(path: str, data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": blob_oid(data), "size": len(data), "path": path}
    if is_lfs(path):
        entry["lfs"] = {
            "oid": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "pointerSize": 134,
        }
    return entry


def _folder_entry(commit: FakeCommit, path: str) -> dict[str, Any]:
    return {"type": "directory", "oid": tree_oid(commit.files, path), "size": 0, "path": path}


def _entry(commit: FakeCommit, path: str) -> dict[str, Any] | None:
    path = path.strip("/")
    if path in commit.files:
        return _file_entry(path, commit.files[path])
    if any(name.startswith(path + "/") for name in commit.files):
        return _folder_entry(commit, path)
    return None


def byte_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """A single `bytes=a-b` / `bytes=a-` / `bytes=-n` range as (first, last), "unsatisfiable",
    or None to answer the whole file (no header, or one the fake does not serve)."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header.removeprefix("bytes=").strip().partition("-")
    if not (first.isdigit() or last.isdigit()):
        return None
    if not first:
        start, end = max(0, size - int(last)), size - 1
    else:
        start = int(first)
        end = min(size - 1, int(last)) if last.isdigit() else size - 1
    if start >= size or end < start:
        return "unsatisfiable"
    return start, end


def gguf_summary(commit: FakeCommit) -> dict[str, Any] | None:
    """What the Hub shows as a repo's `gguf`: the main file's template and tokens, parsed here
    with gguf's own reader (the first file by name, neither a projector nor a later shard)."""
    from gguf import GGUFReader  # only the fake Hub parses whole files

    names = sorted(
        n
        for n in commit.files
        if n.endswith(".gguf")
        and "mmproj" not in n.lower()
        and ("-of-" not in n or "-00001-of-" in n)
    )
    if not names:
        return None
    with tempfile.NamedTemporaryFile(suffix=".gguf") as handle:
        handle.write(commit.files[names[0]])
        handle.flush()
        try:
            reader = GGUFReader(handle.name)
        except Exception:
            return None  # the Hub shows nothing for a file it cannot parse

    def text(key: str) -> str | None:
        field = reader.fields.get(key)
        return bytes(field.parts[field.data[0]]).decode() if field is not None else None

    def number(key: str) -> int | None:
        field = reader.fields.get(key)
        return int(field.parts[field.data[0]][0]) if field is not None else None

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocabulary = [bytes(tokens.parts[i]).decode() for i in tokens.data] if tokens else []
    summary: dict[str, Any] = {"total": sum(len(b) for n, b in commit.files.items() if n in names)}
    architecture = text("general.architecture")
    if architecture:
        summary["architecture"] = architecture
        if (context := number(f"{architecture}.context_length")) is not None:
            summary["context_length"] = context
    if (template := text("tokenizer.chat_template")) is not None:
        summary["chat_template"] = template
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
        index = number(f"tokenizer.ggml.{key}")
        if index is not None and 0 <= index < len(vocabulary):
            summary[name] = vocabulary[index]
    return summary


def _repo_of(path: str) -> str | None:
    """The repo a request is about (for the log), before routing decides anything."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 4 and parts[:2] == ["api", "models"]:
        return f"{parts[2]}/{parts[3]}"
    if len(parts) >= 5 and parts[2] == "resolve":
        return f"{parts[0]}/{parts[1]}"
    return None


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class FakeHubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One buffered write per response and no Nagle: otherwise delayed ACKs add 40 ms a request.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: FakeHubServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the request log replaces stderr noise

    # --- plumbing -------------------------------------------------------------------------

    @property
    def state(self) -> HubState:
        return self.server.state

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = parse_qs(split.query)
        body = b""
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        self._repo_id: str | None = _repo_of(path)
        self._status = 0
        self._sent = 0
        fault = self.state.take_fault(path)
        if self.state.latency:
            time.sleep(self.state.latency)
        try:
            if fault is not None and fault.kind == "slow":
                time.sleep(fault.delay)
            if fault is not None and fault.kind == "429":
                wait = fault.retry_after
                self._json(
                    429,
                    {"error": "You have been rate-limited."},
                    {
                        "Retry-After": str(wait),
                        "RateLimit": f'"api";r=0;t={wait}',
                        "RateLimit-Policy": '"fixed window";"api";q=1000;w=300',
                    },
                )
                return
            if fault is not None and fault.kind == "404":
                self._json(404, {"error": "Not Found"})
                return
            if fault is not None and fault.kind == "500":
                self._json(500, {"error": "Internal Error - We're working hard to fix this."})
                return
            self._route(
                method, path, query, body, truncated=fault is not None and fault.kind == "truncated"
            )
        except HubError as err:
            headers = {} if self.state.minimal else {"X-Error-Message": err.message}
            if err.code and not self.state.minimal:
                headers["X-Error-Code"] = err.code
            self._json(err.status, {"error": err.message}, headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.state.record(LoggedRequest(method, path, self._repo_id, self._status, self._sent))

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
        *,
        head_only: bool = False,
        truncated: bool = False,
    ) -> None:
        self._status = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if truncated:
            self.send_header("Connection", "close")
        self.end_headers()
        if head_only:
            return
        if truncated:
            # Promise the whole body, deliver half, hang up: what a dropped connection looks like.
            self._sent = len(body) // 2
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._sent = len(body)
        self.wfile.write(body)

    def _json(
        self,
        status: int,
        payload: Any,
        headers: dict[str, str] | None = None,
        *,
        truncated: bool = False,
    ) -> None:
        body = json.dumps(payload).encode()
        self._send(status, body, "application/json; charset=utf-8", headers, truncated=truncated)

    def _base_url(self) -> str:
        return f"http://{self.headers.get('Host') or '127.0.0.1'}"

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth.removeprefix("Bearer ").strip() or None

    # --- routing --------------------------------------------------------------------------

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes, *, truncated: bool
    ) -> None:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["_fakehub"]:
            self._control(method, parts[1:], body)
            return
        if parts == ["api", "models"] and method == "GET":
            self._list_models(query, truncated=truncated)
            return
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            repo_id = f"{parts[2]}/{parts[3]}"
            rest = parts[4:]
            if not rest and method == "GET":
                self._model_info(repo_id, "main", query, truncated=truncated)
                return
            if len(rest) == 2 and rest[0] == "revision" and method == "GET":
                self._model_info(repo_id, rest[1], query, truncated=truncated)
                return
            if len(rest) == 2 and rest[0] == "commits" and method == "GET":
                self._commits(repo_id, rest[1], query, truncated=truncated)
                return
            if len(rest) >= 2 and rest[0] == "tree" and method == "GET":
                self._tree(repo_id, rest[1], "/".join(rest[2:]), query, truncated=truncated)
                return
            if len(rest) == 2 and rest[0] == "paths-info" and method == "POST":
                self._paths_info(repo_id, rest[1], body, truncated=truncated)
                return
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            repo_id = f"{parts[0]}/{parts[1]}"
            self._resolve(repo_id, parts[3], "/".join(parts[4:]), method, truncated=truncated)
            return
        raise HubError(404, None, "Sorry, we can't find the page you are looking for.")

    def _repo(self, repo_id: str) -> FakeRepo:
        repo = self.state.store.get(repo_id)
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        if repo.private and self._token() not in repo.allowed_tokens:
            raise HubError(401, "RepoNotFound", "Invalid username or password.")
        return repo

    def _commit(self, repo: FakeRepo, revision: str) -> FakeCommit:
        commit = repo.commit_at(revision)
        if commit is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _model_info(
        self, repo_id: str, revision: str, query: dict[str, list[str]], *, truncated: bool
    ) -> None:
        with self.state.store.lock:
            repo = self._repo(repo_id)
            commit = self._commit(repo, revision)
            blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
            blobs = blobs and not self.state.minimal
            siblings = []
            for name in sorted(commit.files):
                sibling: dict[str, Any] = {"rfilename": name}
                if blobs:
                    entry = _file_entry(name, commit.files[name])
                    sibling.update(size=entry["size"], blobId=entry["oid"])
                    if "lfs" in entry:
                        sibling["lfs"] = {
                            "sha256": entry["lfs"]["oid"],
                            "size": entry["lfs"]["size"],
                            "pointerSize": entry["lfs"]["pointerSize"],
                        }
                siblings.append(sibling)
            payload: dict[str, Any] = {
                "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo.author,
                "sha": commit.sha,
                "lastModified": _iso(commit.date),
                "createdAt": _iso(repo.commits[0].date),
                "private": repo.private,
                "gated": repo.gated,
                "disabled": repo.disabled,
                "downloads": repo.downloads,
                "likes": repo.likes,
                "tags": repo.tags,
                "pipeline_tag": repo.pipeline_tag,
                "library_name": repo.library_name,
                "cardData": repo.card_data(),
                "siblings": siblings,
                "spaces": [],
            }
            config = repo.config_summary(commit)
            if config is not None:
                payload["config"] = config
            expand = query.get("expand", [])
            if expand:
                # The Hub answers the fields asked for, and the ids, nothing else.
                wanted = {"cardData" if e == "card_data" else e for e in expand}
                payload = {k: v for k, v in payload.items() if k in wanted or k in ("_id", "id")}
                if "gguf" in wanted and (summary := gguf_summary(commit)) is not None:
                    payload["gguf"] = summary
            elif self.state.minimal:
                del payload["sha"]
        self._json(200, payload, truncated=truncated)

    def _list_models(self, query: dict[str, list[str]], *, truncated: bool) -> None:
        def first(name: str) -> str | None:
            return query.get(name, [None])[0]

        repos = self.state.store.all()
        author, search = first("author"), first("search")
        pipeline_tag, sort = first("pipeline_tag"), first("sort")
        tags = query.get("filter", [])
        selected = [
            r
            for r in repos
            if not r.private
            and (author is None or r.author.lower() == author.lower())
            and (search is None or search.lower() in r.repo_id.lower())
            and (pipeline_tag is None or r.pipeline_tag == pipeline_tag)
            and all(t in r.tags for t in tags)
        ]
        if sort in ("downloads", "likes", "trendingScore"):
            attribute = "trending_score" if sort == "trendingScore" else sort
            selected.sort(key=lambda r: (getattr(r, attribute), r.repo_id), reverse=True)
        elif sort in ("lastModified", "last_modified"):
            selected.sort(key=lambda r: r.head.date, reverse=True)
        else:
            selected.sort(key=lambda r: r.repo_id)
        limit = int(first("limit") or self.state.models_page_size)
        page_size = min(limit, self.state.models_page_size)
        offset = int(first("cursor") or 0)
        page = selected[offset : offset + page_size]
        headers = {}
        if offset + page_size < len(selected):
            next_query = {k: v for k, v in query.items() if k != "cursor"}
            next_query["cursor"] = [str(offset + page_size)]
            url = f"{self._base_url()}/api/models?{urlencode(next_query, doseq=True)}"
            headers["Link"] = f'<{url}>; rel="next"'
        payload = [
            {
                "_id": hashlib.md5(r.repo_id.encode()).hexdigest()[:24],
                "id": r.repo_id,
                "modelId": r.repo_id,
                "author": r.author,
                "downloads": r.downloads,
                "likes": r.likes,
                "tags": r.tags,
                "pipeline_tag": r.pipeline_tag,
                "library_name": r.library_name,
                "private": r.private,
                "gated": r.gated,
                "lastModified": _iso(r.head.date),
                "createdAt": _iso(r.commits[0].date),
            }
            for r in page
        ]
        self._json(200, payload, headers, truncated=truncated)

    def _commits(
        self, repo_id: str, revision: str, query: dict[str, list[str]], *, truncated: bool
    ) -> None:
        with self.state.store.lock:
            repo = self._repo(repo_id)
            commit = self._commit(repo, revision)
            index = repo.commits.index(commit)
            history = list(reversed(repo.commits[: index + 1]))
        page_number = int(query.get("p", ["0"])[0])
        size = self.state.commits_page_size
        page = history[page_number * size : (page_number + 1) * size]
        headers = {}
        if (page_number + 1) * size < len(history):
            url = (
                f"{self._base_url()}/api/models/{repo_id}/commits/{quote(revision, safe='')}"
                f"?p={page_number + 1}"
            )
            headers["Link"] = f'<{url}>; rel="next"'
        payload = [
            {
                "id": c.sha,
                "title": c.title,
                "message": "",
                "date": _iso(c.date),
                "authors": [{"user": "fakehub", "avatar": ""}],
            }
            for c in page
        ]
        self._json(200, payload, headers, truncated=truncated)

    def _tree(
        self,
        repo_id: str,
        revision: str,
        folder: str,
        query: dict[str, list[str]],
        *,
        truncated: bool,
    ) -> None:
        with self.state.store.lock:
            repo = self._repo(repo_id)
            commit = self._commit(repo, revision)
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        if prefix and _entry(commit, folder) is None:
            raise HubError(404, "EntryNotFound", f"{folder} does not exist on {revision}")
        entries: dict[str, dict[str, Any]] = {}
        for name in sorted(commit.files):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            if recursive or "/" not in rest:
                entries[name] = _file_entry(name, commit.files[name])
            if "/" in rest:
                sub = prefix + rest.split("/", 1)[0]
                entries.setdefault(sub, _folder_entry(commit, sub))
        self._json(200, list(entries.values()), truncated=truncated)

    def _paths_info(self, repo_id: str, revision: str, body: bytes, *, truncated: bool) -> None:
        with self.state.store.lock:
            repo = self._repo(repo_id)
            commit = self._commit(repo, revision)
        form = parse_qs(body.decode())
        found = [e for p in form.get("paths", []) if (e := _entry(commit, p)) is not None]
        self._json(200, found, truncated=truncated)

    def _resolve(
        self, repo_id: str, revision: str, path: str, method: str, *, truncated: bool
    ) -> None:
        with self.state.store.lock:
            repo = self._repo(repo_id)
            if repo.disabled:
                raise HubError(403, None, "Access to this resource is disabled.")
            if repo.gated and self._token() not in repo.allowed_tokens:
                status = 401 if self._token() is None else 403
                raise HubError(
                    status,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it "
                    "and be authenticated to access it. Please log in.",
                )
            commit = self._commit(repo, revision)
            data = commit.files.get(path)
        if data is None:
            raise HubError(404, "EntryNotFound", f"Entry not found: {path}")
        entry = _file_entry(path, data)
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{entry["oid"]}"'}
        if "lfs" in entry:
            headers["ETag"] = f'"{entry["lfs"]["oid"]}"'
            headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
            headers["X-Linked-Size"] = str(len(data))
        status = 200
        wanted = byte_range(self.headers.get("Range"), len(data))
        if isinstance(wanted, str):
            headers["Content-Range"] = f"bytes */{len(data)}"
            self._send(416, b"", "text/plain", headers)
            return
        if wanted is not None:
            start, end = wanted
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        headers["Accept-Ranges"] = "bytes"
        self._send(
            status,
            data,
            "application/octet-stream",
            headers,
            head_only=method == "HEAD",
            truncated=truncated,
        )

    # --- control API for a fake Hub running as a separate process ---------------------------

    def _control(self, method: str, parts: list[str], body: bytes) -> None:
        if parts == ["stats"] and method == "GET":
            with self.state.lock:
                log = list(self.state.log)
            per_repo: dict[str, int] = {}
            for entry in log:
                if entry.repo_id:
                    per_repo[entry.repo_id] = per_repo.get(entry.repo_id, 0) + 1
            self._json(200, {"requests": len(log), "repos": len(per_repo), "per_repo": per_repo})
            return
        if parts == ["reset-log"] and method == "POST":
            with self.state.lock:
                self.state.log.clear()
            self._json(200, {"ok": True})
            return
        raise HubError(404, None, "no such control endpoint")


class FakeHubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, state: HubState, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), FakeHubHandler)
        self.state = state


class FakeHub:
    """A running fake Hub: its URL, its repos (`store`), fault injection and the request log."""

    def __init__(self, state: HubState | None = None, port: int = 0) -> None:
        self.state = state or HubState()
        self.server = FakeHubServer(self.state, port)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def store(self) -> RepoStore:
        return self.state.store

    def start(self) -> FakeHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def inject(
        self,
        kind: str,
        times: int = 1,
        match: str = "",
        *,
        retry_after: int = 1,
        delay: float = 0.0,
    ) -> Fault:
        """Make the next `times` requests whose path contains `match` fail with `kind`."""
        if kind not in ("404", "429", "500", "slow", "truncated"):
            raise ValueError(f"unknown fault {kind!r}")
        fault = Fault(kind, times, match, retry_after, delay)
        with self.state.lock:
            self.state.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.state.lock:
            self.state.faults.clear()

    def requests(self, repo_id: str | None = None) -> list[LoggedRequest]:
        with self.state.lock:
            return [e for e in self.state.log if repo_id is None or e.repo_id == repo_id]

    def reset_log(self) -> None:
        with self.state.lock:
            self.state.log.clear()

    @contextmanager
    def running(self) -> Iterator[FakeHub]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
