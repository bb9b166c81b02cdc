"""The registry's endpoints (served by dashboard/api.py): model detail, track (JSON API and
form), the Hub webhook; and what the API refuses before its views run (type, size, nesting)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis.exceptions
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client

from dashboard import api
from registry import rate_limits, tracking
from registry.hub import HubClient
from registry.models import (
    REPO_ID_INPUT_PATTERN,
    HubModel,
    HubModelQuerySet,
    ModelStatus,
    Watch,
    WatchKind,
    validate_repo_id,
)
from registry.sync import RegistrySync
from registry.tasks import sync_repo  # noqa: F401 - registers hub.sync_repo for the eager runs
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import fake_hub, hub_settings
from workers.celery import app

pytestmark = pytest.mark.django_db
__all__ = ["fake_hub", "hub_settings"]

TEMPLATE = b"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
DETAIL_KEYS = {
    "repo_id",
    "author",
    "status",
    "status_reason",
    "sync_error",
    "verdict",
    "verdict_summary",
    "downloads",
    "likes",
    "tags",
    "pipeline_tag",
    "library_name",
    "model_type",
    "architectures",
    "is_hybrid",
    "has_sliding_window",
    "quantization",
    "base_model",
    "last_commit_sha",
    "last_commit_at",
    "template",
    "history",
    "history_complete",
}


@pytest.fixture(autouse=True)
def fresh_track_limits() -> None:
    """The per-address count lives in the shared cache (Redis in CI): start each test at zero."""
    for address in ("127.0.0.1", "203.0.113.9", "203.0.113.10"):
        tracking.forget_track_requests(address)


@pytest.fixture
def eager() -> Iterator[None]:
    """Queued tasks run in-process, so a test sees the sync a request queued."""
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture
def hub_repo(fake_hub: FakeHub, hub_settings: Any) -> str:
    fake_hub.store.create_repo("acme/chat-7b", downloads=42, likes=3)
    fake_hub.store.add_commit(
        "acme/chat-7b",
        {"tokenizer_config.json": tokenizer_config(TEMPLATE, "<s>", "</s>")},
        "Upload model",
    )
    return "acme/chat-7b"


def queued_syncs(callbacks: list[Any]) -> list[Any]:
    """The on-commit callbacks that queue a sync (other apps add their own callbacks)."""
    # Each is `registry.jobs.enqueue_on_commit`'s send: partial(send, task, args, kwargs).
    return [c for c in callbacks if getattr(c, "args", (None,))[:1] == ("hub.sync_repo",)]


def synced(repo_id: str) -> HubModel:
    model, _ = HubModel.objects.track(repo_id, via="track")
    RegistrySync(HubClient(timeout=5)).sync(model)
    return HubModel.objects.get(pk=model.pk)


def test_model_detail_shows_status_template_and_history(client: Client, hub_repo: str) -> None:
    model = synced(hub_repo)
    response = client.get(f"/api/models/{hub_repo}")
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= DETAIL_KEYS  # plus the check and probe fields (dashboard/api.py)
    assert body["status"] == "ok"
    assert (body["downloads"], body["likes"]) == (42, 3)
    assert body["template"]["source_file"] == "tokenizer_config.json"
    assert body["template"]["commit"] == model.last_commit_sha
    assert [h["commit"] for h in body["history"]] == [model.last_commit_sha]
    assert body["history"][0]["template_sha256"] == body["template"]["sha256"]
    assert body["history"][0]["previous_sha256"] is None


def test_model_detail_of_an_untracked_repo_is_a_json_404(client: Client) -> None:
    response = client.get("/api/models/nobody/nothing")
    assert response.status_code == 404
    assert response.json() == {
        "error": {"code": "not_found", "message": "nobody/nothing is not tracked"}
    }


def test_track_api_tracks_once_and_queues_one_sync(
    client: Client, hub_repo: str, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client.post(
            "/api/models", json.dumps({"repo_id": hub_repo}), content_type="application/json"
        )
    assert response.status_code == 201
    assert response["Location"] == f"/api/models/{hub_repo}"
    assert len(queued_syncs(callbacks)) == 1
    # The queued sync ran (eagerly): the model is filled in.
    assert client.get(f"/api/models/{hub_repo}").json()["status"] == ModelStatus.OK
    with django_capture_on_commit_callbacks() as callbacks:
        again = client.post(
            "/api/models", json.dumps({"repo_id": hub_repo}), content_type="application/json"
        )
    assert again.status_code == 200 and queued_syncs(callbacks) == []


def post_json(client: Client, url: str, body: str | bytes, **extra: Any) -> Any:
    return client.post(url, body, content_type="application/json", **extra)


def error_of(response: Any, status: int) -> dict[str, str]:
    """The API's one error shape: JSON `{"error": {"code", "message"}}`, with this status."""
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return dict(body["error"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "expected a JSON body"),
        (json.dumps({"repo": "a/b"}), "repo_id: Field required"),
        (json.dumps(["acme/chat-7b"]), "body"),
        (json.dumps({"repo_id": 7}), "repo_id: Input should be a valid string"),
        (json.dumps({"repo_id": "../../etc/passwd"}), "is not a Hub model id"),
        (json.dumps({"repo_id": "no-slash"}), "is not a Hub model id"),
        (json.dumps({"repo_id": "acme/chat\u0000"}), "NUL"),
        (json.dumps({"repo_id": "a" * 301}), "at most 300 characters"),
        ("[" * 33 + "]" * 33, "deeper than 32"),
        ("[" * 60_000, "deeper than 32"),
        ('{"repo_id": "acme/x", "extra": ' + "[" * 40 + "]" * 40 + "}", "deeper than 32"),
    ],
)
def test_track_api_refuses_bad_input(client: Client, body: str, message: str) -> None:
    error = error_of(post_json(client, "/api/models", body), 400)
    assert message in error["message"]
    assert error["code"] in {"invalid_request", "invalid_json"}
    assert not HubModel.objects.exists()


def test_track_api_refuses_an_empty_json_body(client: Client) -> None:
    # The test client leaves the type out of a bodiless request; a real client may send it.
    response = client.generic("POST", "/api/models", b"", CONTENT_TYPE="application/json")
    assert "Field required" in error_of(response, 400)["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_track_api_takes_json_only(client: Client, content_type: str) -> None:
    body = json.dumps({"repo_id": "acme/chat-7b"})
    response = client.post("/api/models", body, content_type=content_type)
    assert error_of(response, 415)["code"] == "unsupported_media_type"
    assert not HubModel.objects.exists()


def test_a_cross_site_form_cannot_track(hub_repo: str) -> None:
    """What a page elsewhere can make a browser send without a preflight: a text/plain body
    (the API is CSRF-exempt for its clients, so the content type is what stops it)."""
    browser = Client(enforce_csrf_checks=True, headers={"Origin": "https://evil.example"})
    response = browser.post("/api/models", json.dumps({"repo_id": hub_repo}), "text/plain")
    assert response.status_code == 415
    assert not HubModel.objects.exists()


def test_track_api_refuses_large_bodies_before_reading_them(client: Client) -> None:
    padded = json.dumps({"repo_id": "acme/chat-7b", "pad": "x" * api.TRACK_BODY_BYTES})
    assert error_of(post_json(client, "/api/models", padded), 413)["code"] == "payload_too_large"
    # The declared length decides: 20 bytes sent, a gigabyte announced, nothing read.
    claimed = post_json(client, "/api/models", b'{"repo_id": "a/b"}', CONTENT_LENGTH=str(2**30))
    assert error_of(claimed, 413)["code"] == "payload_too_large"
    assert not HubModel.objects.exists()


@pytest.mark.parametrize(
    "outage",
    [
        rate_limits.RateLimitUnavailable("rate limits unavailable"),
        redis.exceptions.ConnectionError("Connection refused"),
    ],
)
def test_track_api_answers_503_when_the_cache_is_down(
    client: Client, monkeypatch: pytest.MonkeyPatch, outage: Exception
) -> None:
    def down(request: Any) -> bool:
        raise outage

    monkeypatch.setattr(tracking, "may_track", down)
    response = post_json(client, "/api/models", json.dumps({"repo_id": "acme/chat-7b"}))
    assert error_of(response, 503)["code"] == "service_unavailable"
    assert int(response["Retry-After"]) > 0
    assert not HubModel.objects.exists()


def test_track_api_is_rate_limited_per_client_address(
    client: Client, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    monkeypatch.setattr(tracking, "TRACK_REQUESTS_PER_HOUR", 2)
    statuses = []
    with django_capture_on_commit_callbacks():
        for number in range(3):
            response = client.post(
                "/api/models",
                json.dumps({"repo_id": f"acme/model-{number}"}),
                content_type="application/json",
                REMOTE_ADDR="203.0.113.9",
            )
            statuses.append(response.status_code)
        other = client.post(
            "/api/models",
            json.dumps({"repo_id": "acme/other"}),
            content_type="application/json",
            REMOTE_ADDR="203.0.113.10",
        )
    assert statuses == [201, 201, 429]
    assert error_of(response, 429)["code"] == "rate_limited"
    assert response["Retry-After"] == "3600"
    assert other.status_code == 201
    assert not HubModel.objects.filter(repo_id="acme/model-2").exists()


def test_track_api_needs_no_csrf_token(hub_repo: str) -> None:
    strict = Client(enforce_csrf_checks=True)
    response = strict.post(
        "/api/models", json.dumps({"repo_id": hub_repo}), content_type="application/json"
    )
    assert response.status_code == 201


def post_hook(client: Client, payload: dict[str, Any], secret: str | None) -> Any:
    headers = {"X-Webhook-Secret": secret} if secret is not None else {}
    return client.post(
        "/hooks/hub", json.dumps(payload), content_type="application/json", headers=headers
    )


HOOK = {"event": {"action": "update", "scope": "repo.content"}, "repo": {"type": "model"}}


def test_webhook_with_the_secret_syncs_the_repo_at_once(
    client: Client,
    hub_repo: str,
    fake_hub: FakeHub,
    hub_settings: Any,
    eager: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    hub_settings.HF_WEBHOOK_SECRET = "s3cret"
    synced(hub_repo)
    new = fake_hub.store.add_commit(
        hub_repo, {"tokenizer_config.json": tokenizer_config(TEMPLATE + b" ", None, None)}, "v2"
    )
    payload = {**HOOK, "repo": {"type": "model", "name": hub_repo, "headSha": new.sha}}
    with django_capture_on_commit_callbacks(execute=True):
        response = post_hook(client, payload, "s3cret")
    assert response.status_code == 202
    assert response.json() == {"queued": hub_repo}
    assert client.get(f"/api/models/{hub_repo}").json()["history"][0]["commit"] == new.sha


@pytest.mark.parametrize("given", ["wrong", "", None])
def test_webhook_with_a_bad_secret_is_refused(
    client: Client, hub_repo: str, hub_settings: Any, given: str | None
) -> None:
    hub_settings.HF_WEBHOOK_SECRET = "s3cret"
    HubModel.objects.track(hub_repo, via="track")
    payload = {**HOOK, "repo": {"type": "model", "name": hub_repo}}
    response = post_hook(client, payload, given)
    assert error_of(response, 403)["code"] == "forbidden"
    assert HubModel.objects.get(repo_id=hub_repo).status == ModelStatus.PENDING


def test_webhook_is_closed_when_no_secret_is_configured(
    client: Client, hub_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_settings.HF_WEBHOOK_SECRET = ""
    payload = {**HOOK, "repo": {"type": "model", "name": "acme/chat-7b"}}
    assert post_hook(client, payload, "").status_code == 403


def test_webhook_tracks_new_repos_of_watched_authors_only(
    client: Client, hub_settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    hub_settings.HF_WEBHOOK_SECRET = "s3cret"
    Watch.objects.create(kind=WatchKind.AUTHOR, author="acme")
    with django_capture_on_commit_callbacks() as callbacks:
        watched = post_hook(
            client, {**HOOK, "repo": {"type": "model", "name": "acme/new"}}, "s3cret"
        )
        other = post_hook(client, {**HOOK, "repo": {"type": "model", "name": "else/new"}}, "s3cret")
        dataset = post_hook(
            client, {**HOOK, "repo": {"type": "dataset", "name": "acme/d"}}, "s3cret"
        )
    assert (watched.status_code, other.status_code, dataset.status_code) == (202, 202, 202)
    assert list(HubModel.objects.values_list("repo_id", flat=True)) == ["acme/new"]
    assert "ignored" in other.json() and "ignored" in dataset.json()
    assert len(queued_syncs(callbacks)) == 1


def test_webhook_refuses_what_it_cannot_read(client: Client, hub_settings: Any) -> None:
    hub_settings.HF_WEBHOOK_SECRET = "s3cret"
    secret = {"X-Webhook-Secret": "s3cret"}
    plain = client.post("/hooks/hub", json.dumps(HOOK), content_type="text/plain", headers=secret)
    assert error_of(plain, 415)["code"] == "unsupported_media_type"
    big = json.dumps({**HOOK, "pad": "x" * api.HOOK_BODY_BYTES})
    assert error_of(post_json(client, "/hooks/hub", big, headers=secret), 413)
    deep = post_json(client, "/hooks/hub", '{"repo": ' + "[" * 50_000, headers=secret)
    assert "deeper than 32" in error_of(deep, 400)["message"]
    named = {**HOOK, "repo": {"type": "model", "name": "acme/\u0000"}}
    assert "NUL" in error_of(post_hook(client, named, "s3cret"), 400)["message"]
    bad = {**HOOK, "repo": {"type": "model", "name": "no slash"}}
    assert "is not a Hub model id" in error_of(post_hook(client, bad, "s3cret"), 400)["message"]
    assert not HubModel.objects.exists()


def test_webhook_checks_the_secret_before_reading_the_body(
    client: Client, hub_settings: Any
) -> None:
    hub_settings.HF_WEBHOOK_SECRET = "s3cret"
    response = post_json(client, "/hooks/hub", "not json", headers={"X-Webhook-Secret": "no"})
    assert error_of(response, 403)["code"] == "forbidden"


def test_webhook_for_a_repo_tracked_in_other_letters_syncs_it(
    client: Client, hub_settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """A reader tracked "qwen/qwen3-8b"; the Hub's webhook names "Qwen/Qwen3-8B": the change was
    ignored as "not tracked", and the page waited for the next scheduled sync."""
    hub_settings.HF_WEBHOOK_SECRET = "s3cret"
    HubModel.objects.track("qwen/qwen3-8b", via="form")
    with django_capture_on_commit_callbacks() as callbacks:
        answer = post_hook(
            client, {**HOOK, "repo": {"type": "model", "name": "Qwen/Qwen3-8B"}}, "s3cret"
        )
    assert (answer.status_code, answer.json()) == (202, {"queued": "qwen/qwen3-8b"})
    assert len(queued_syncs(callbacks)) == 1
    assert HubModel.objects.count() == 1


def test_track_form_shows_and_tracks(
    client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    page = client.get("/track/")
    assert page.status_code == 200
    assert b'name="repo_id"' in page.content
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/track/", {"repo_id": " Qwen/Qwen3-0.6B "}, follow=True)
    assert response.status_code == 200
    assert b"Now tracking Qwen/Qwen3-0.6B" in response.content
    assert HubModel.objects.get(repo_id="Qwen/Qwen3-0.6B").tracked_via == "form"
    assert len(queued_syncs(callbacks)) == 1


def test_track_form_refuses_an_invalid_id(client: Client) -> None:
    response = client.post("/track/", {"repo_id": "not a repo"})
    assert response.status_code == 400
    assert b"is not a Hub model id (expected owner/name)" in response.content
    assert not HubModel.objects.exists()


@pytest.mark.parametrize(
    ("repo_id", "reason"),
    [
        ("no-slash", "expected owner/name"),
        ("a/b/c", "expected owner/name"),
        ("acme/", "expected owner/name"),
        ("acme/" + "m" * 97, "97 characters in one part, at most 96"),
        ("o" * 200 + "/m", "200 characters in one part, at most 96"),
        ("acme/chat 7b", "only ASCII letters, digits, '-', '_' and '.'; not ' '"),
        ("acme/chat<b>", "only ASCII letters, digits, '-', '_' and '.'; not '<' '>'"),
        ("acme/chat--7b", "no '--' or '..'"),
        ("_acme/chat", "the owner starts and ends with an ASCII letter or digit"),
        ("acmé/chat", "only ASCII letters, digits, '-', '_' and '.'; not 'é'"),
        # A letter past ASCII anywhere: the Hub has none, and no URL of the site could name it.
        ("aéb/x", "only ASCII letters, digits, '-', '_' and '.'; not 'é'"),
        ("acme/chát--7b", "only ASCII letters, digits, '-', '_' and '.'; not 'á'"),
        ("acme/chat-", "the name may not start or end with '-' or '.'"),
    ],
)
def test_an_invalid_id_is_told_what_is_wrong_with_it(repo_id: str, reason: str) -> None:
    with pytest.raises(ValidationError) as refused:
        validate_repo_id(repo_id)
    assert f"is not a Hub model id ({reason}" in refused.value.messages[0]
    # With that one thing changed, the id passes.
    assert validate_repo_id("acme/" + "m" * 96) == "acme/" + "m" * 96
    assert validate_repo_id("acme/_chat_") == "acme/_chat_"  # a name may start with '_'


@pytest.mark.parametrize(
    "pasted",
    [
        "https://huggingface.co/Qwen/Qwen3-0.6B",
        "https://huggingface.co/Qwen/Qwen3-0.6B/tree/main",
        "huggingface.co/Qwen/Qwen3-0.6B/blob/main/tokenizer_config.json#L12",
        "https://hf.co/Qwen/Qwen3-0.6B?library=transformers",
        "https://huggingface.co/Qwen/Qwen3-0.6B/discussions/3/",
    ],
)
def test_an_address_copied_from_a_hub_page_gives_its_repo_id(pasted: str) -> None:
    """What a reader copies from the browser on any of the repo's pages, and the schema's
    pattern says the same to clients."""
    assert validate_repo_id(pasted) == "Qwen/Qwen3-0.6B"
    assert re.match(REPO_ID_INPUT_PATTERN, pasted)
    with pytest.raises(ValidationError):
        validate_repo_id("https://huggingface.co/Qwen/Qwen3-0.6B/settings")
    assert not re.match(REPO_ID_INPUT_PATTERN, "https://huggingface.co/Qwen/Qwen3-0.6B/settings")


def test_an_empty_track_post_is_told_what_is_missing_and_past_the_allowance_429(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A POST with no field at all is a bound form with an error (it was an unbound form, and
    past the hourly allowance adding the error to it raised: a 500)."""
    monkeypatch.setattr(tracking, "TRACK_REQUESTS_PER_HOUR", 2)  # each POST counts
    first = client.post("/track/", REMOTE_ADDR="203.0.113.20")
    assert first.status_code == 400
    assert b"This field is required" in first.content
    client.post("/track/", {"repo_id": "acme/one"}, REMOTE_ADDR="203.0.113.20")
    refused = client.post("/track/", REMOTE_ADDR="203.0.113.20")
    assert refused.status_code == 429
    assert b"Too many track requests" in refused.content
    assert list(HubModel.objects.values_list("repo_id", flat=True)) == ["acme/one"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="two writers at once: SQLite runs one at a time"
)
def test_two_spellings_tracked_at_the_same_instant_make_one_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both requests look the repo up, find nothing, then insert: the database settles it
    (`one_model_per_repo_id`), and the one that lost gets the model the other made."""
    both_looked = threading.Barrier(2, timeout=10)
    create = HubModelQuerySet.create

    def after_both_looked(self: HubModelQuerySet, **fields: Any) -> HubModel:
        both_looked.wait()
        return create(self, **fields)

    monkeypatch.setattr(HubModelQuerySet, "create", after_both_looked)
    results: dict[str, tuple[HubModel, bool]] = {}

    def track(repo_id: str) -> None:
        try:
            results[repo_id] = HubModel.objects.track(repo_id, via="api")
        finally:
            connection.close()

    threads = [threading.Thread(target=track, args=(r,)) for r in ("Acme/Chat-8B", "acme/chat-8b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(results) == 2
    assert sorted(created for _, created in results.values()) == [False, True]
    assert len({model.pk for model, _ in results.values()}) == 1
    assert HubModel.objects.count() == 1


def test_an_id_in_other_letters_is_the_model_already_tracked(
    client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    """The Hub's ids are case-insensitive: a second row in other letters would hide the first
    from every case-insensitive lookup (the model page, the API's model)."""
    with django_capture_on_commit_callbacks():
        made = client.post(
            "/api/models", json.dumps({"repo_id": "Acme/Chat-8B"}), content_type="application/json"
        )
        again = client.post(
            "/api/models", json.dumps({"repo_id": "ACME/chat-8b"}), content_type="application/json"
        )
        form = client.post("/track/", {"repo_id": "acme/CHAT-8B"}, follow=True)
    assert made.status_code == 201
    assert again.status_code == 200
    assert again.json()["repo_id"] == "Acme/Chat-8B"
    assert b"Acme/Chat-8B is already tracked" in form.content
    assert list(HubModel.objects.values_list("repo_id", flat=True)) == ["Acme/Chat-8B"]
