"""The one way the registry talks to the Hugging Face Hub: huggingface_hub's client, with our
rate limit, backoff and size caps around every HTTP request.

Every request goes through `HubClient._call`: it takes a token from the credential's shared
bucket, and retries 429 (waiting what `Retry-After` / `RateLimit` say), 5xx and timeouts with
jittered exponential backoff. We page list endpoints ourselves rather than through the client's
`paginate`, because that retries with real sleeps outside our bucket.

Only endpoints every Hub-shaped server has are used: model info, list models, commits, tree
and file resolve (paths-info would save nothing: the root tree is one request too).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx2
from django.conf import settings
from huggingface_hub import HfApi, get_session, hf_hub_url, hf_raise_for_status
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
)

# Public (listed in huggingface_hub.utils.__all__, which is built lazily, so mypy cannot see it).
from huggingface_hub.utils import (  # type: ignore[attr-defined]
    build_hf_headers,
    parse_datetime,
    parse_ratelimit_headers,
)

from . import rate_limits
from .repo_files import BrokenRepo

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_TREE_PAGES = 20
#: The most pages one list (commits, models) is read to: a Hub whose pages never end (each
#: links a new next page, however empty) costs this many requests, then an error.
MAX_LIST_PAGES = 500
RETRY_STATUSES = frozenset({408, 500, 502, 503, 504})
TRANSIENT_ERRORS = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
#: What reading a Hub's answer as what was asked raises when the answer is not that (a 200 of
#: HTML, model info whose fields have the wrong types): the Hub's fault, so the repo is tried
#: again later, as for a 500.
MALFORMED_ANSWER = (ValueError, KeyError, TypeError, AttributeError)
#: The longest wait a 429 may ask for that is taken as said (a day): a larger one is a broken
#: header, and a countdown past the calendar's end fails Celery's retry.
MAX_RETRY_AFTER = 86_400.0
#: The `X-Error-Code` of a commit the repo no longer has (its history rewritten since).
REVISION_GONE = "RevisionNotFound"
#: A file's whole download may take this many times the per-read timeout (a minute by
#: default): a Hub that sends a byte at a time, each within the timeout, is cut off.
DOWNLOAD_TIMEOUTS = 3


class HubUnavailable(Exception):
    """The Hub did not answer usefully after our retries: try the whole repo again later."""

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        *,
        status: int | None = None,
        code: str = "",
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        #: The HTTP status of an error answer that is not retried (a 404 for a file, say).
        self.status = status
        #: Its `X-Error-Code`, where the Hub gave one ("RevisionNotFound", …).
        self.code = code


def read_answer(what: str, read: Callable[[], T]) -> T:
    """`read()`, which reads a Hub's answer as what was asked; an answer it cannot read is
    `HubUnavailable`, with what was wrong."""
    try:
        return read()
    except MALFORMED_ANSWER as err:
        raise HubUnavailable(
            f"{what}: the Hub's answer could not be read ({type(err).__name__}: {err})"[:300]
        ) from err


class RepoUnavailable(Exception):
    """The Hub answered, and the answer is that we may not (or cannot) read this repo."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int | None
    oid: str  # git blob id, or a folder's tree id
    lfs_sha256: str | None = None
    is_folder: bool = False

    @property
    def content_id(self) -> str:
        """What identifies the bytes: the LFS SHA-256 when stored in LFS, else the git id."""
        return self.lfs_sha256 or self.oid


@dataclass(frozen=True)
class RepoInfo:
    repo_id: str
    sha: str
    last_modified: datetime | None
    author: str
    private: bool
    gated: bool
    disabled: bool
    downloads: int
    likes: int
    tags: list[str]
    pipeline_tag: str
    library_name: str
    base_model: str
    gguf: bool
    files: dict[str, FileInfo] = field(default_factory=dict)
    #: What the Hub summarises of config.json in model info (model type, architectures).
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    date: datetime | None
    title: str


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _base_model(card: Any) -> str:
    value = getattr(card, "base_model", None) if card is not None else None
    if isinstance(value, list):
        value = value[0] if value else None
    return _text(value, 200)


#: The parts of the Hub's config summary the registry reads before it downloads config.json.
CONFIG_SUMMARY_KEYS = ("model_type", "architectures", "quantization_config", "quantization")


def _config_summary(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        return {}
    return {key: config[key] for key in CONFIG_SUMMARY_KEYS if key in config}


def unavailable_status(err: HfHubHTTPError) -> RepoUnavailable | None:
    """Map an error answer to a repo status; None when it is not about access (retry later).

    Only the Hub's own `RepoNotFound` is "missing" at once. A bare 404 (no `X-Error-Code`,
    which huggingface_hub raises as a plain `HfHubHTTPError`) comes from proxies, load
    balancers and Hub hiccups too: `HubUnavailable` with its status, and the sync decides
    (`registry.sync.record_not_found`)."""
    response = err.response
    status = response.status_code if response is not None else None
    code = response.headers.get("X-Error-Code", "") if response is not None else ""
    message = response.headers.get("X-Error-Message", "") if response is not None else ""
    if isinstance(err, GatedRepoError) or code == "GatedRepo":
        return RepoUnavailable("gated", "gated: accept the conditions on the Hub with our token")
    if isinstance(err, DisabledRepoError) or status == 451 or "disabled" in message.lower():
        return RepoUnavailable("disabled", "disabled on the Hub")
    if isinstance(err, RepositoryNotFoundError) or code == "RepoNotFound":
        if status == 404:
            return RepoUnavailable("missing", "not found on the Hub (404)")
        return RepoUnavailable("private", f"private: the Hub refused access ({status})")
    if status in (401, 403):
        return RepoUnavailable("private", f"private: the Hub refused access ({status})")
    return None


class HubClient:
    """Read-only access to the Hub for the registry. `sleep` and `clock` are injectable."""

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        *,
        bucket: rate_limits.Bucket | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        max_attempts: int | None = None,
        timeout: float | None = None,
        max_wait: float = 120.0,
    ) -> None:
        self.endpoint = (endpoint or settings.HF_ENDPOINT).rstrip("/")
        self.token = token if token is not None else settings.HF_TOKEN
        # False, not None: huggingface_hub would otherwise send a token found on this machine.
        self._auth: str | bool = self.token or False
        self.api = HfApi(endpoint=self.endpoint, token=self._auth)
        self.bucket = bucket or rate_limits.hub_bucket(self.token, clock)
        self.sleep = sleep
        self.max_attempts = max_attempts or int(settings.HF_MAX_ATTEMPTS)
        self.timeout = timeout or float(settings.HF_TIMEOUT_SECONDS)
        self.max_wait = max_wait
        self.requests = 0
        self.bytes_read = 0

    # --- the choke point ---------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return float(min(30.0, 2.0 ** (attempt - 1)) * (0.5 + random.random()))

    def _take_token(self, what: str) -> None:
        waited = 0.0
        while (wait := self.bucket.take()) > 0:
            if waited + wait > self.max_wait:
                raise HubUnavailable(f"{what}: rate limit, retry in {wait:.0f}s", wait)
            self.sleep(wait)
            waited += wait

    def _call(self, what: str, request: Callable[[], T]) -> T:
        """Run one HTTP request with the rate limit and retries; map access errors."""
        last = ""
        for attempt in range(1, self.max_attempts + 1):
            self._take_token(what)
            self.requests += 1
            try:
                return request()
            except HfHubHTTPError as err:
                unavailable = unavailable_status(err)
                if unavailable is not None:
                    raise unavailable from err
                status = err.response.status_code if err.response is not None else None
                if status == 429:
                    wait = self._retry_after(err.response) or self._backoff(attempt)
                    # Everyone on this credential waits, not only us: a wait too long to sleep
                    # through here too, or the other workers would go on asking meanwhile.
                    self.bucket.block(wait)
                    if wait > self.max_wait:
                        raise HubUnavailable(f"{what}: rate limited for {wait:.0f}s", wait) from err
                    last = f"rate limited (429, retry after {wait:.0f}s)"
                elif status in RETRY_STATUSES:
                    wait = self._backoff(attempt)
                    last = f"Hub error {status}"
                else:
                    response = err.response
                    code = response.headers.get("X-Error-Code", "") if response is not None else ""
                    raise HubUnavailable(
                        f"{what}: Hub answered {status}", status=status, code=code
                    ) from err
            except TRANSIENT_ERRORS as err:
                wait = self._backoff(attempt)
                last = f"{type(err).__name__}: {err}"[:200]
            except httpx2.HTTPError as err:  # redirects that never end, a bad encoding, …
                raise HubUnavailable(f"{what}: {type(err).__name__}: {err}"[:300]) from err
            if attempt < self.max_attempts:
                logger.info("%s: %s; retry %d in %.1fs", what, last, attempt, wait)
                self.sleep(wait)
        raise HubUnavailable(f"{what}: {last} after {self.max_attempts} attempts")

    @staticmethod
    def _retry_after(response: httpx2.Response | None) -> float | None:
        if response is None:
            return None
        try:
            info = parse_ratelimit_headers(response.headers)
        except ValueError:  # a number of more digits than `int` reads
            info = None
        if info is not None and info.remaining == 0:
            # Bounded as an integer first: `float` of a 400-digit reset overflows.
            return min(
                float(min(info.reset_in_seconds, int(MAX_RETRY_AFTER))) + 1.0, MAX_RETRY_AFTER
            )
        value = (response.headers.get("Retry-After") or "").strip()
        if not (value.isascii() and value.isdigit()):  # ("²" is a digit to isdigit)
            return None
        return min(float(value[:12]) + 1.0, MAX_RETRY_AFTER)

    def _in_time(self, deadline: float, got: int, what: str) -> None:
        """`HubUnavailable` once a download passes its `deadline`: not retried at once, since
        each try would take as long, and a task's time limit would end the sync unrecorded."""
        if time.monotonic() > deadline:
            took = self.timeout * DOWNLOAD_TIMEOUTS
            raise HubUnavailable(f"{what}: the Hub sent {got:,} bytes in {took:.0f}s: too slowly")

    def _get(self, url: str, params: dict[str, Any] | None = None) -> httpx2.Response:
        response = get_session().get(
            url, params=params, headers=build_hf_headers(token=self._auth), timeout=self.timeout
        )
        try:
            hf_raise_for_status(response)
        except ValueError as err:
            # huggingface_hub reads a 429's `RateLimit` header into its message, and a number
            # of more digits than `int` reads raises instead: the error answer it is, unread.
            raise HfHubHTTPError(f"{response.status_code}: {err}", response=response) from err
        return response

    def _pages(self, what: str, url: str, params: dict[str, Any]) -> Iterator[list[Any]]:
        next_url: str | None = url
        next_params: dict[str, Any] | None = params
        seen: set[str] = set()
        while next_url is not None:
            if next_url in seen or len(seen) >= MAX_LIST_PAGES:
                raise HubUnavailable(f"{what}: the Hub's pages do not end")
            seen.add(next_url)
            response = self._call(
                what,
                lambda u=next_url, p=next_params: self._get(u, p),  # type: ignore[misc]
            )
            payload = read_answer(what, response.json)
            if not isinstance(payload, list):
                raise HubUnavailable(f"{what}: the Hub did not answer a list")
            yield payload
            next_url = response.links.get("next", {}).get("url")
            next_params = None  # the next link carries the query

    # --- what the registry asks --------------------------------------------------------------

    def model_info(self, repo_id: str) -> RepoInfo:
        """The repo's head commit and metadata, with file sizes and ids: one request."""
        what = f"{repo_id} info"
        info = self._call(
            what,
            lambda: read_answer(
                what,
                lambda: self.api.model_info(
                    repo_id, files_metadata=True, timeout=self.timeout, token=self._auth
                ),
            ),
        )
        return read_answer(what, lambda: self._repo_info(repo_id, info))

    @staticmethod
    def _repo_info(repo_id: str, info: Any) -> RepoInfo:
        files = {
            s.rfilename: FileInfo(
                s.rfilename, s.size, s.blob_id or "", s.lfs.sha256 if s.lfs else None
            )
            for s in info.siblings or []
        }
        tags = [t for t in info.tags or [] if isinstance(t, str)][:200]
        return RepoInfo(
            repo_id=info.id or repo_id,
            sha=info.sha or "",  # sync asks the commits when a Hub leaves it out
            last_modified=info.last_modified,
            author=_text(info.author, 100) or repo_id.split("/", 1)[0],
            private=bool(info.private),
            gated=bool(info.gated),
            disabled=bool(info.disabled),
            downloads=int(info.downloads or 0),
            likes=int(info.likes or 0),
            tags=tags,
            pipeline_tag=_text(info.pipeline_tag, 100),
            library_name=_text(info.library_name, 100),
            base_model=_base_model(info.card_data),
            gguf=bool(info.gguf) or "gguf" in tags,
            files=files,
            config=_config_summary(info.config),
        )

    @staticmethod
    def _file_info(item: Any) -> FileInfo | None:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            return None
        lfs = item.get("lfs")
        return FileInfo(
            path=item["path"],
            size=item.get("size") if isinstance(item.get("size"), int) else None,
            oid=str(item.get("oid") or ""),
            lfs_sha256=str(lfs["oid"]) if isinstance(lfs, dict) and "oid" in lfs else None,
            is_folder=item.get("type") == "directory",
        )

    def list_folder(self, repo_id: str, revision: str, folder: str = "") -> list[FileInfo]:
        """The entries (files and folders, with their ids) directly in `folder` at `revision`;
        the repo's root when `folder` is empty. One request per page of 1,000."""
        path = f"/{quote(folder, safe='')}" if folder else ""
        url = f"{self.endpoint}/api/models/{repo_id}/tree/{quote(revision, safe='')}{path}"
        entries: list[FileInfo] = []
        for number, page in enumerate(
            self._pages(f"{repo_id}@{revision[:8]} tree {folder}", url, {"recursive": False})
        ):
            entries += [e for e in map(self._file_info, page) if e is not None]
            if number >= MAX_TREE_PAGES:
                break  # a hostile or absurd repo; what matters sits at the top level anyway
        return entries

    def iter_commits(self, repo_id: str, revision: str) -> Iterator[CommitInfo]:
        """Commits reachable from `revision`, newest first; pages are fetched as consumed."""
        url = f"{self.endpoint}/api/models/{repo_id}/commits/{quote(revision, safe='')}"
        for page in self._pages(f"{repo_id} commits", url, {}):
            for item in page:
                if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                    continue
                date = item.get("date")
                yield CommitInfo(
                    sha=item["id"][:40],
                    date=parse_datetime(date) if isinstance(date, str) else None,
                    title=_text(item.get("title"), 500),
                )

    def download(self, repo_id: str, revision: str, path: str, max_bytes: int) -> bytes:
        """One file at a pinned commit, refusing more than `max_bytes` (BrokenRepo)."""
        url = hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)

        def request() -> bytes:
            headers = build_hf_headers(token=self._auth)
            deadline = time.monotonic() + self.timeout * DOWNLOAD_TIMEOUTS
            with get_session().stream("GET", url, headers=headers, timeout=self.timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    hf_raise_for_status(resp)
                declared = resp.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise BrokenRepo(
                        f"{path} is {int(declared):,} bytes, over the {max_bytes:,} cap"
                    )
                chunks, size = [], 0
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise BrokenRepo(f"{path} is over the {max_bytes:,}-byte cap")
                    chunks.append(chunk)
                    self._in_time(deadline, size, path)
                return b"".join(chunks)

        return self._call(f"{repo_id}@{revision[:8]} {path}", request)

    def read_range(self, repo_id: str, revision: str, path: str, start: int, size: int) -> bytes:
        """`size` bytes of a file from `start` (fewer at its end), by an HTTP range request.

        A server that ignores the range and answers the whole file is read only as far as
        needed, never further."""
        url = hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)
        end = start + size

        def request() -> bytes:
            headers = build_hf_headers(token=self._auth)
            headers["Range"] = f"bytes={start}-{end - 1}"
            deadline = time.monotonic() + self.timeout * DOWNLOAD_TIMEOUTS
            with get_session().stream("GET", url, headers=headers, timeout=self.timeout) as resp:
                if resp.status_code == 416:
                    return b""  # the range starts past the end of the file
                if resp.status_code >= 400:
                    resp.read()
                    hf_raise_for_status(resp)
                skip = 0 if resp.status_code == 206 else start
                chunks, got = [], 0
                for chunk in resp.iter_bytes():
                    chunks.append(chunk)
                    got += len(chunk)
                    if got >= skip + size:
                        break
                    self._in_time(deadline, got, path)
                self.bytes_read += got
                return b"".join(chunks)[skip : skip + size]

        return self._call(f"{repo_id}@{revision[:8]} {path} bytes {start}-{end - 1}", request)

    def gguf_summary(self, repo_id: str) -> dict[str, Any]:
        """What the Hub parsed from the repo's main GGUF file (`expand=["gguf"]`): its chat
        template, bos and eos tokens, architecture. Empty when the Hub has none."""
        what = f"{repo_id} gguf"
        info = self._call(
            what,
            lambda: read_answer(
                what,
                lambda: self.api.model_info(
                    repo_id, expand=["gguf"], timeout=self.timeout, token=self._auth
                ),
            ),
        )
        gguf = getattr(info, "gguf", None)
        return gguf if isinstance(gguf, dict) else {}

    def iter_models(
        self,
        *,
        author: str | None = None,
        search: str | None = None,
        pipeline_tag: str | None = None,
        tags: str | None = None,
        sort: str = "downloads",
        limit: int = 100,
    ) -> Iterator[str]:
        """Repo ids of a Hub query (what `HfApi.list_models` asks), at most `limit`; `tags`
        (comma-separated) are ANDed, as `filter=` is on the Hub; `sort` is the Hub's field
        (downloads, likes, trendingScore, lastModified), largest first."""
        params: dict[str, Any] = {"limit": limit}
        if tags:
            params["filter"] = [t.strip() for t in tags.split(",") if t.strip()]
        if author:
            params["author"] = author
        if search:
            params["search"] = search
        if pipeline_tag:
            params["pipeline_tag"] = pipeline_tag
        if sort:
            params["sort"] = sort
        count = 0
        for page in self._pages("list models", f"{self.endpoint}/api/models", params):
            for item in page:
                repo_id = item.get("id") if isinstance(item, dict) else None
                if isinstance(repo_id, str):
                    yield repo_id
                    count += 1
                    if count >= limit:
                        return
