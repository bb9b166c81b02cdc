"""Answers from a Hub-shaped server that no Hub should give: redirects that never end, a 200
that is not JSON, model info whose fields have the wrong types, pages that link to themselves,
a file sent a byte at a time, a 429 that asks for centuries. Each is `HubUnavailable`, with
what was wrong, in a bounded number of requests and seconds: a sync records it and the run goes
on (`tests/test_sync_batches.py`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from registry.hub import DOWNLOAD_TIMEOUTS, MAX_RETRY_AFTER, HubClient, HubUnavailable

SHA = "a" * 40

#: What the server answers for a path containing the key: (status, headers, body chunks, the
#: seconds between chunks).
Answer = tuple[int, dict[str, str], list[bytes], float]


class Bucket:
    """No rate limit: these tests count requests, not tokens."""

    def take(self) -> float:
        return 0.0

    def block(self, seconds: float) -> None:
        pass


class Canned(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answers: dict[str, Callable[[str], Answer]] = {}
    hits: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.hits.append(self.path)
        for key, answer in self.answers.items():
            if key in self.path:
                status, headers, chunks, pause = answer(self.path)
                break
        else:
            status, headers, chunks, pause = 404, {}, [b"{}"], 0.0
        self.send_response(status)
        headers.setdefault("Content-Length", str(sum(map(len, chunks))))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(chunk)
            self.wfile.flush()
            time.sleep(pause)


@pytest.fixture
def hub() -> Iterator[tuple[str, dict[str, Callable[[str], Answer]], list[str]]]:
    answers: dict[str, Callable[[str], Answer]] = {}
    hits: list[str] = []
    handler = type("Handler", (Canned,), {"answers": answers, "hits": hits})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", answers, hits
    server.shutdown()
    server.server_close()


def client(endpoint: str, **options: Any) -> HubClient:
    sleeps: list[float] = []
    return HubClient(
        endpoint=endpoint, token="", bucket=Bucket(), sleep=sleeps.append, max_attempts=2, **options
    )


def test_redirects_that_never_end_are_the_hubs_fault_not_a_crash(hub: Any) -> None:
    endpoint, answers, hits = hub
    answers["loop"] = lambda path: (302, {"Location": path}, [], 0.0)
    with pytest.raises(HubUnavailable, match="TooManyRedirects"):
        client(endpoint).model_info("o/loop")
    with pytest.raises(HubUnavailable, match="TooManyRedirects"):
        client(endpoint).download("o/loop", SHA, "tokenizer_config.json", 1 << 20)
    assert len(hits) <= 2 * 21  # one try each (not retried), each 20 redirects at most


def test_an_answer_that_is_not_what_was_asked_is_the_hubs_fault(hub: Any) -> None:
    endpoint, answers, _ = hub
    answers["o/html"] = lambda path: (200, {}, [b"<html>maintenance</html>"], 0.0)
    bad = {"id": "o/bad", "sha": SHA, "downloads": "many", "siblings": []}
    answers["o/bad"] = lambda path: (200, {}, [json.dumps(bad).encode()], 0.0)
    nameless = {"id": "o/nameless", "sha": SHA, "siblings": [{"size": 3}]}
    answers["o/nameless"] = lambda path: (200, {}, [json.dumps(nameless).encode()], 0.0)
    answers["commits"] = lambda path: (200, {}, [b"not json"], 0.0)
    for repo_id in ("o/html", "o/bad", "o/nameless"):
        with pytest.raises(HubUnavailable, match="the Hub's answer could not be read"):
            client(endpoint).model_info(repo_id)
    with pytest.raises(HubUnavailable, match="the Hub's answer could not be read"):
        list(client(endpoint).iter_commits("o/html", SHA))


def test_pages_that_link_to_themselves_are_asked_once(hub: Any) -> None:
    endpoint, answers, hits = hub

    def itself(path: str) -> Answer:
        return 200, {"Link": f'<{endpoint}{path}>; rel="next"'}, [b"[]"], 0.0

    answers["commits"] = itself
    answers["/api/models?"] = itself
    hub_client = client(endpoint)
    with pytest.raises(HubUnavailable, match="pages do not end"):
        list(hub_client.iter_commits("o/self", SHA))
    with pytest.raises(HubUnavailable, match="pages do not end"):
        list(hub_client.iter_models(search="x"))
    # The commits' first page is its own next page: one request. The models' first page is
    # asked with its query as parameters, and links itself with them in its URL: two.
    assert hub_client.requests == 3


def test_pages_that_never_end_stop_at_the_cap(hub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, answers, _ = hub
    monkeypatch.setattr("registry.hub.MAX_LIST_PAGES", 5)

    def onwards(path: str) -> Answer:
        number = int(path.rsplit("page=", 1)[1]) if "page=" in path else 0
        link = f'<{endpoint}/api/models/o/endless/commits/{SHA}?page={number + 1}>; rel="next"'
        return 200, {"Link": link}, [b"[]"], 0.0

    answers["commits"] = onwards
    hub_client = client(endpoint)
    with pytest.raises(HubUnavailable, match="pages do not end"):
        list(hub_client.iter_commits("o/endless", SHA))
    assert hub_client.requests == 5


def test_a_file_sent_a_byte_at_a_time_is_cut_off_at_its_deadline(hub: Any) -> None:
    endpoint, answers, hits = hub
    answers["slow"] = lambda path: (200, {}, [b"x"] * 16, 0.4)  # each read well in time
    hub_client = client(endpoint, timeout=1)
    started = time.monotonic()
    with pytest.raises(HubUnavailable, match="tokenizer_config.json: the Hub sent .* too slowly"):
        hub_client.download("o/slow", SHA, "tokenizer_config.json", 1 << 20)
    took = time.monotonic() - started
    assert DOWNLOAD_TIMEOUTS <= took < 16 * 0.4  # cut off, not read to its end
    assert len(hits) == 1  # not tried again at once: each try would take as long
    with pytest.raises(HubUnavailable, match="too slowly"):
        hub_client.read_range("o/slow", SHA, "m.gguf", 0, 1 << 20)


def test_a_429_that_asks_for_centuries_waits_a_day(hub: Any) -> None:
    endpoint, answers, _ = hub
    answers["o/limited"] = lambda path: (429, {"Retry-After": "1" + "0" * 12}, [b"{}"], 0.0)
    with pytest.raises(HubUnavailable) as raised:
        client(endpoint).model_info("o/limited")
    assert raised.value.retry_after == MAX_RETRY_AFTER
    # "²" is a digit to `str.isdigit`, not to `float`: a wait the header does not give.
    answers["o/odd"] = lambda path: (429, {"Retry-After": "\u00b2"}, [b"{}"], 0.0)
    with pytest.raises(HubUnavailable, match="rate limited") as odd:
        client(endpoint).model_info("o/odd")
    assert odd.value.retry_after is None


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_429_whose_ratelimit_header_asks_for_centuries_waits_a_day(hub: Any, digits: int) -> None:
    """The `RateLimit` header's reset, as absurd as `Retry-After` above. 400 digits overflowed
    `float`; past 4,300 digits huggingface_hub's own reading of the header raised. Each was a
    crash of the sync, with the credential not paused. A reset too long to read gives no wait:
    the request is retried as after a 500."""
    endpoint, answers, _ = hub
    header = {"RateLimit": f'"api";r=0;t=1{"0" * digits}'}
    answers["o/limited"] = lambda path: (429, header, [b"{}"], 0.0)
    readable = digits < 4300
    with pytest.raises(HubUnavailable, match="rate limit") as listed:
        list(client(endpoint).iter_commits("o/limited", SHA))
    assert listed.value.retry_after == (MAX_RETRY_AFTER if readable else None)
    with pytest.raises(HubUnavailable) as raised:
        client(endpoint).model_info("o/limited")
    assert raised.value.retry_after == (MAX_RETRY_AFTER if readable else None)
