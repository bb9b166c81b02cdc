"""Probe results on the model page, the catalog's probe badge and filter, the probe queue page and
its JSON, and the staff actions (re-sync, re-check, probe) with their live progress."""

from __future__ import annotations

import copy
import json
import math
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries, DjangoCaptureOnCommitCallbacks
from pytest_django.fixtures import Settings as SettingsWrapper

from registry.models import (
    CatalogVerdict,
    CheckRun,
    CheckStatus,
    HubModel,
    NamedTemplate,
    ProbeRun,
    ProbeState,
    ProbeStatus,
    TemplateVersion,
)
from registry.probes import request_probe_once, store_report
from tests.dashboard_data import (
    HOSTILE_REPO,
    Catalog,
    build_catalog,
    healthy_service,  # noqa: F401 - a fixture
)
from workers import health
from workers.models import WorkerHeartbeat

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}

#: A report shaped exactly like docs/probe.md (schema_version 1): a hybrid model that loses its
#: cache on the plain library path and keeps most of it with checkpoints.
REPORT: dict[str, Any] = {
    "schema_version": 1,
    "status": "ok",
    "error": None,
    "job": {
        "repo_id": "cachesafe-demo/marker-chat-8b",
        "revision": "0" * 40,
        "quantization": "4bit",
        "prompt_sizes": [1024],
        "paths": ["library", "library_checkpoints"],
    },
    "machine": {
        "chip": "Apple M2 Max",
        "arch": "arm64",
        "cpu_count": 12,
        "memory_bytes": 68719476736,
        "os": "macOS 14.5",
        "python": "3.11.9",
        "mlx": "0.32.4",
        "mlx_lm": "0.32.2",
        "mlx_device": "Device(gpu, 0)",
    },
    "model": {
        "model_type": "qwen3_next",
        "load_seconds": 1.2,
        "has_thinking": True,
        "weights_bytes": 123,
        "cache_layers": [
            {"class": "ArraysCache", "trimmable": False, "bytes": 0},
            {"class": "ArraysCache", "trimmable": False, "bytes": 0},
            {"class": "KVCache", "trimmable": True, "bytes": 0},
        ],
    },
    "settings": {
        "paths": ["library", "library_checkpoints"],
        "prompt_sizes": [1024],
        "reply_mode": "forced",
        "max_reply_tokens": 8,
        "repeats": 3,
        "threshold": 0.1,
        "miss_below": 0.05,
        "template_kwargs": {},
        "server_startup_timeout_s": 120.0,
    },
    "started_at": "2026-11-21T12:00:00+00:00",
    "seconds": 41.2,
    "results": [],
}


def result(
    path: str, verdict: str, share: float, *, kind: str | None, warm_ms: float, reused: int
) -> dict[str, Any]:
    """One conversation × size × path of the report: one pair, then the exact repeat."""

    def correct(delta: float) -> dict[str, Any]:
        return {"max_abs_logprob_delta": delta, "same_greedy_token": True, "threshold": 0.1,
                "ok": True}  # fmt: skip

    return {
        "conversation": "weather", "prompt_size": 1024, "path": path, "reply_mode": "forced",
        "verdict": verdict, "reused_share": share, "disagreement": kind is not None,
        "disagreement_kind": kind, "predicted_source": "job",
        "cold_ttft_ms_median": 227.9, "warm_ttft_ms_median": warm_ms,
        "ttft_ratio": round(227.9 / warm_ms, 2),
        "pairs": [{
            "index": 2, "prompt_tokens": 725, "held_tokens": 726, "reusable_tokens": 700,
            "predicted_tokens": 700, "reused_tokens": reused, "cold_ttft_ms": 227.9,
            "warm_ttft_ms": warm_ms, "correctness": correct(0.0004), "note": "",
        }],
        "exact_repeat": {
            "prompt_tokens": 778, "reused_tokens": reused and 777, "cold_ttft_ms": 253.5,
            "warm_ttft_ms": warm_ms, "correctness": correct(0.0),
        },
        "cache_layers": [{"class": "ArraysCache", "trimmable": False, "bytes": 18432}],
        "kv_snapshot_bytes": 1234, "prompt_cache_bytes": 5678, "peak_memory_bytes": 9012,
        "seconds": 2.46, "agrees_with": None, "error": None,
    }  # fmt: skip


REPORT["results"] = [
    result("library", "miss", 0.0, kind="engine_loses", warm_ms=226.0, reused=0),
    result("library_checkpoints", "partial", 0.964, kind=None, warm_ms=17.0, reused=699),
]


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


@pytest.fixture
def staff_client(client: Client) -> Client:
    client.force_login(User.objects.create_user("ops", "ops@example.org", "pw", is_staff=True))
    return client


@pytest.fixture
def fresh_status() -> None:
    """The queue page asks workers.health afresh, not a status cached by an earlier test, nor
    one a background refresh started by an earlier test writes late."""
    health.forget_cached_status()


def probed(model: HubModel, report: dict[str, Any] = REPORT) -> ProbeRun:
    run = ProbeRun.objects.create(model=model, commit_sha="a" * 40, quantization="4bit")
    stored = store_report(run.pk, report)
    assert stored is not None
    return stored


def probe_section(body: str) -> str:
    return body.split('id="probe-h"')[1].split("</section>")[0]


def rows(body: str) -> list[str]:
    return re.findall(r'class="repo" href="/m/([^"]+)/"', body)


# --- the model page ---------------------------------------------------------------------------


def test_probe_section_shows_the_latest_report(client: Client, catalog: Catalog) -> None:
    probed(catalog.unsafe)
    section = probe_section(client.get(f"/m/{catalog.unsafe.repo_id}/").content.decode())
    # Worst verdict over the results, the lowest reused share, and that it disagrees.
    assert "Cache lost" in section and "lowest reuse 0%" in section
    assert "Disagrees with the template check" in section
    # The machine it ran on, and the cache's layer classes.
    assert "Apple M2 Max" in section and "mlx 0.32.4" in section and "mlx-lm 0.32.2" in section
    assert "ArraysCache × 2, KVCache × 1" in section
    # One row per conversation × size × path with the report's numbers.
    table = section.split("<tbody>")[1]
    library, checkpoints = table.split("</tr>")[:2]
    assert "<code>library</code>" in library and "engine_loses" in library
    assert "700</span> → 0" in library and "of 726" in library
    assert "228 → 226 ms" in library and "(1.0×)" in library
    assert "same output" in library and 'class="disagrees"' in library
    assert "<code>library_checkpoints</code>" in checkpoints and "96%" in checkpoints
    assert "700</span> → 699" in checkpoints and "228 → 17 ms" in checkpoints
    assert "(13.4×)" in checkpoints
    assert "disagrees" not in checkpoints
    assert "No probe yet" not in section


def test_a_failed_probe_says_why(client: Client, catalog: Catalog) -> None:
    report = {**REPORT, "status": "error", "error": "out of memory: 96 GiB needed", "results": []}
    probed(catalog.unsafe, report)
    section = probe_section(client.get(f"/m/{catalog.unsafe.repo_id}/").content.decode())
    assert "Probe failed" in section and "out of memory: 96 GiB needed" in section
    assert "hx-trigger" not in section
    # A probe that measured nothing does not change the catalog's probe badge.
    assert not CatalogVerdict.objects.filter(model=catalog.unsafe).exclude(probe="none").exists()


def test_a_queued_probe_polls_until_its_report_is_stored(client: Client, catalog: Catalog) -> None:
    run = ProbeRun.objects.create(model=catalog.unsafe, commit_sha="a" * 40)
    url = f"/m/{catalog.unsafe.repo_id}/"
    page = client.get(url)
    assert page["Cache-Control"] == "no-store"  # live progress is never cached
    section = probe_section(page.content.decode())
    assert "Waiting for the Mac worker" in section and 'hx-trigger="every 3s"' in section
    assert "The Mac worker is offline" in section  # no heartbeat from an mlx worker
    WorkerHeartbeat.beat("mac-1", ["mlx"], {})
    poll = client.get(url, headers={**HTMX, "HX-Target": "probe-status"})
    fragment = poll.content.decode()
    assert fragment.lstrip().startswith('<div id="probe-status"') and "<html" not in fragment
    assert 'hx-trigger="every 3s"' in fragment and poll["Cache-Control"] == "no-store"
    assert "offline" not in fragment
    ProbeRun.objects.filter(pk=run.pk).update(state=ProbeState.RUNNING, worker="mac-1")
    running = client.get(url, headers={**HTMX, "HX-Target": "probe-status"}).content.decode()
    assert "Running on the Mac" in running and "mac-1" in running and "hx-trigger" in running
    store_report(run.pk, REPORT)
    final = client.get(url, headers={**HTMX, "HX-Target": "probe-status"}).content.decode()
    assert "hx-trigger" not in final  # the last answer stops polling
    assert "Cache lost" in final and "700</span> → 699" in final


def test_probe_strings_are_escaped(client: Client, catalog: Catalog) -> None:
    """Conversation names, machine facts and errors come from the worker: never markup."""
    report = copy.deepcopy(REPORT)
    report["results"][0]["conversation"] = "<script>alert('conv')</script>"
    report["results"][1]["error"] = '"><img src=x onerror=alert(1)>'
    report["machine"]["chip"] = "<b>M9</b>"
    report["model"]["cache_layers"][0]["class"] = "<i>Cache</i>"
    probed(catalog.hostile, report)
    body = client.get(f"/m/{HOSTILE_REPO}/").content.decode()
    section = probe_section(body)
    assert "&lt;script&gt;alert(&#x27;conv&#x27;)&lt;/script&gt;" in section
    assert "&lt;b&gt;M9&lt;/b&gt;" in section and "&lt;i&gt;Cache&lt;/i&gt;" in section
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in section
    for raw in ("<script>alert('conv')", "<img src=x", "<b>M9", "<i>Cache"):
        assert raw not in body


@pytest.mark.usefixtures("healthy_service")
def test_model_page_with_a_probe_costs_the_same_queries(
    client: Client,
    catalog: Catalog,
    django_assert_num_queries: DjangoAssertNumQueries,
    settings: SettingsWrapper,
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    probed(catalog.changed)
    # model, newest check, latest probe (report included), timeline, named templates, derivatives
    with django_assert_num_queries(6):
        response = client.get(f"/m/{catalog.changed.repo_id}/")
    assert "Cache lost" in probe_section(response.content.decode())


# --- the catalog ------------------------------------------------------------------------------


def test_stored_probe_sets_the_catalog_badge_and_filter(
    client: Client, catalog: Catalog, django_capture_on_commit_callbacks: Any
) -> None:
    assert CatalogVerdict.objects.get(model=catalog.unsafe).probe == ProbeStatus.NONE
    probed(catalog.unsafe)
    assert CatalogVerdict.objects.get(model=catalog.unsafe).probe == ProbeStatus.MISS
    body = client.get("/", {"probe": "miss"}).content.decode()
    assert rows(body) == [catalog.unsafe.repo_id]
    badges = body.split('class="verdicts"')[1].split("</div>")[0]
    assert "badge-probe-miss" in badges and ">Probe: cache lost</span>" in badges
    assert catalog.unsafe.repo_id not in rows(client.get("/", {"probe": "none"}).content.decode())
    assert rows(client.get("/", {"probe": "hit"}).content.decode()) == []
    # The next probe replaces the badge (once stored: the page cache moves on at commit).
    report = copy.deepcopy(REPORT)
    for result in report["results"]:
        result |= {"verdict": "hit", "reused_share": 1.0, "disagreement": False}
    with django_capture_on_commit_callbacks(execute=True):
        probed(catalog.unsafe, report)
    assert rows(client.get("/", {"probe": "hit"}).content.decode()) == [catalog.unsafe.repo_id]


def test_a_model_probed_before_its_first_check_gets_a_catalog_row(catalog: Catalog) -> None:
    model = HubModel.objects.create(repo_id="new-org/unchecked", author="new-org")
    probed(model)
    assert CatalogVerdict.objects.get(model=model).probe == ProbeStatus.MISS


@pytest.mark.usefixtures("healthy_service")
def test_catalog_probe_filter_costs_two_queries(
    client: Client,
    catalog: Catalog,
    django_assert_num_queries: DjangoAssertNumQueries,
    settings: SettingsWrapper,
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    for model in (catalog.unsafe, catalog.safe, catalog.changed):
        probed(model)
    with django_assert_num_queries(2):
        response = client.get("/", {"probe": "miss"})
    assert len(rows(response.content.decode())) == 3


def test_author_filter_offers_to_subscribe(client: Client, catalog: Catalog) -> None:
    body = client.get("/", {"author": "cachesafe-demo"}).content.decode()
    assert 'href="/alerts/?author=cachesafe-demo">Subscribe to cachesafe-demo</a>' in body
    assert "Subscribe to" not in client.get("/").content.decode()
    nav = client.get("/").content.decode().split('<nav aria-label="Main">')[1].split("</nav>")[0]
    assert 'href="/alerts/">Alerts</a>' in nav and 'href="/probes/">Probes</a>' in nav


# --- the probe queue --------------------------------------------------------------------------


def queue_with_two_waiting_and_one_done(catalog: Catalog) -> tuple[ProbeRun, ProbeRun]:
    now = timezone.now()
    first = ProbeRun.objects.create(
        model=catalog.safe, state=ProbeState.RUNNING, worker="mac-1",
        queued_at=now - timedelta(minutes=30), started_at=now - timedelta(minutes=5),
    )  # fmt: skip
    second = ProbeRun.objects.create(model=catalog.unsafe, queued_at=now - timedelta(minutes=7))
    done = probed(catalog.changed)
    ProbeRun.objects.filter(pk=done.pk).update(started_at=done.finished_at - timedelta(seconds=95))  # type: ignore[operator]
    return first, second


@pytest.mark.usefixtures("fresh_status")
def test_probe_queue_with_the_mac_worker_online(client: Client, catalog: Catalog) -> None:
    queue_with_two_waiting_and_one_done(catalog)
    WorkerHeartbeat.beat("mac-1", ["mlx"], {"chip": "Apple M2 Max"})
    response = client.get("/probes/")
    body = response.content.decode()
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    assert "Mac probe worker online: mac-1" in body and "2 probes waiting." in body
    waiting = body.split('id="waiting-h"')[1].split("</section>")[0]
    # Oldest first, with its position and how long it has waited.
    assert waiting.index(catalog.safe.repo_id) < waiting.index(catalog.unsafe.repo_id)
    assert "30 min" in waiting and "7 min" in waiting and "Running" in waiting
    recent = body.split('id="recent-h"')[1].split("</section>")[0]
    assert catalog.changed.repo_id in recent and "Cache lost" in recent
    assert "Apple M2 Max" in recent and "1 min" in recent  # 95 s on the Mac


@pytest.mark.usefixtures("fresh_status")
def test_probe_queue_says_when_the_mac_worker_went_offline(
    client: Client, catalog: Catalog
) -> None:
    WorkerHeartbeat.beat("mac-1", ["mlx"], {})
    gone = timezone.now() - timedelta(hours=2)
    WorkerHeartbeat.objects.filter(hostname="mac-1").update(last_seen=gone)
    body = client.get("/probes/").content.decode()
    assert f"Mac probe worker offline since {gone:%Y-%m-%d %H:%M} UTC" in body
    assert "Offline" in body and "0 probes waiting." in body and "Nothing is waiting." in body


@pytest.mark.usefixtures("fresh_status")
def test_probe_queue_json(client: Client, catalog: Catalog) -> None:
    first, second = queue_with_two_waiting_and_one_done(catalog)
    data = client.get("/api/probes").json()
    assert data["worker"]["online"] is False
    assert data["queue_size"] == 2
    assert [(w["repo_id"], w["position"]) for w in data["waiting"]] == [
        (catalog.safe.repo_id, 1),
        (catalog.unsafe.repo_id, 2),
    ]
    assert data["waiting"][0]["state"] == "running"
    (recent,) = data["recent"]
    assert recent["verdict"] == "miss" and recent["seconds"] == pytest.approx(95)
    assert recent["machine"]["chip"] == "Apple M2 Max" and "report" not in recent
    assert "/api/probes" in client.get("/api/openapi.json").json()["paths"]


def test_model_api_carries_the_latest_probe(client: Client, catalog: Catalog) -> None:
    assert client.get(f"/api/models/{catalog.unsafe.repo_id}").json()["probe"] is None
    probed(catalog.unsafe)
    probe = client.get(f"/api/models/{catalog.unsafe.repo_id}").json()["probe"]
    assert (probe["state"], probe["verdict"], probe["disagreement"]) == ("done", "miss", True)
    assert probe["machine"]["mlx_lm"] == "0.32.2" and "report" not in probe


def test_probe_queue_refuses_post(client: Client) -> None:
    assert client.post("/probes/").status_code == 405
    assert client.post("/api/probes").status_code == 405


# --- staff actions ----------------------------------------------------------------------------


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What the actions hand to Celery, captured at the task's own send method."""
    from probe.tasks import probe_model
    from registry import pipeline
    from registry.tasks import sync_repo

    calls: dict[str, list[Any]] = {"sync": [], "check": [], "probe": []}
    monkeypatch.setattr(
        sync_repo, "apply_async", lambda args, kwargs, **o: calls["sync"].append((args, kwargs))
    )
    monkeypatch.setattr(pipeline, "send_check", lambda run_id: calls["check"].append(run_id))
    monkeypatch.setattr(probe_model, "apply_async", lambda *a, **k: calls["probe"].append((a, k)))
    return calls


ACTIONS = ["resync", "recheck", "probe"]


@pytest.mark.parametrize("action", ACTIONS)
def test_staff_actions_are_refused_to_everyone_else(
    client: Client,
    catalog: Catalog,
    sent: dict[str, list[Any]],
    action: str,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    url = f"/m/{catalog.unsafe.repo_id}/{action}"
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(url, headers=HTMX).status_code == 403  # anonymous
        client.force_login(User.objects.create_user("reader", "r@example.org", "pw"))
        assert client.post(url, headers=HTMX).status_code == 403  # signed in, not staff
    assert sent == {"sync": [], "check": [], "probe": []}
    assert not ProbeRun.objects.exists()
    # Nor does the page offer them.
    assert "Staff actions" not in client.get(f"/m/{catalog.unsafe.repo_id}/").content.decode()


@pytest.mark.parametrize("action", ACTIONS)
def test_staff_actions_need_post_csrf_and_a_tracked_model(
    staff_client: Client, catalog: Catalog, sent: dict[str, list[Any]], action: str
) -> None:
    assert staff_client.get(f"/m/{catalog.unsafe.repo_id}/{action}").status_code == 405
    assert staff_client.post(f"/m/nobody/untracked/{action}").status_code == 404
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="ops"))
    assert strict.post(f"/m/{catalog.unsafe.repo_id}/{action}").status_code == 403
    assert sent == {"sync": [], "check": [], "probe": []}


def test_staff_see_the_actions_and_are_never_served_a_cached_page(
    client: Client, staff_client: Client, catalog: Catalog
) -> None:
    url = f"/m/{catalog.unsafe.repo_id}/"
    anonymous = Client()
    assert anonymous.get(url)["X-Cache"] == "miss"
    assert anonymous.get(url)["X-Cache"] == "hit"
    response = staff_client.get(url)
    body = response.content.decode()
    assert "X-Cache" not in response  # neither read from nor written to the shared cache
    assert "Staff actions" in body and 'name="csrfmiddlewaretoken"' in body
    assert f'hx-post="/m/{catalog.unsafe.repo_id}/probe"' in body
    # The staff page did not end up in the cache that anonymous readers get.
    assert "csrfmiddlewaretoken" not in anonymous.get(url).content.decode()


def test_resync_enqueues_a_forced_sync_and_shows_queued_until_it_ran(
    staff_client: Client,
    catalog: Catalog,
    sent: dict[str, list[Any]],
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    model = catalog.unsafe
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(f"/m/{model.repo_id}/resync", headers=HTMX)
    assert sent["sync"] == [((model.pk,), {"force": True})]
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="sync-status"') and "Sync queued" in fragment
    poll_url = re.search(r'hx-get="([^"]+)"', fragment).group(1)  # type: ignore[union-attr]
    assert poll_url.startswith(f"/m/{model.repo_id}/?sync=")
    poll = staff_client.get(poll_url, headers={**HTMX, "HX-Target": "sync-status"})
    assert "Sync queued" in poll.content.decode() and poll["Cache-Control"] == "no-store"
    # The hub worker syncs: the next poll says so and stops.
    HubModel.objects.filter(pk=model.pk).update(last_synced_at=timezone.now())
    done = staff_client.get(poll_url, headers={**HTMX, "HX-Target": "sync-status"})
    text = done.content.decode()
    assert "Synced" in text and "hx-trigger" not in text
    # Without htmx: back to the page, which shows the same progress.
    with django_capture_on_commit_callbacks(execute=True):
        redirect = staff_client.post(f"/m/{model.repo_id}/resync")
    assert redirect.status_code == 302
    assert redirect["Location"].startswith(f"/m/{model.repo_id}/?sync=")
    assert len(sent["sync"]) == 2


def test_recheck_forces_a_check_of_every_template_of_the_model(
    staff_client: Client,
    catalog: Catalog,
    sent: dict[str, list[Any]],
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    model = catalog.unsafe
    snapshot = model.current_snapshot
    assert snapshot is not None
    tool_use = TemplateVersion.objects.exclude(pk=snapshot.default_template_id).first()
    assert tool_use is not None
    NamedTemplate.objects.create(snapshot=snapshot, name="tool_use", version=tool_use)
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(f"/m/{model.repo_id}/recheck", headers=HTMX)
    checked = CheckRun.objects.filter(pk__in=sent["check"])
    assert {run.template_version_id for run in checked} == {
        snapshot.default_template_id,
        tool_use.pk,
    }
    assert all(run.status == CheckStatus.PENDING for run in checked)
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="check-status"')
    assert "Checking…" in fragment and 'hx-trigger="every 2s"' in fragment
    assert f'hx-get="/m/{model.repo_id}/"' in fragment  # polls the page, not the action


def test_probe_action_queues_one_probe_on_the_mac_queue(
    staff_client: Client,
    catalog: Catalog,
    sent: dict[str, list[Any]],
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    model = catalog.unsafe
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(f"/m/{model.repo_id}/probe", headers=HTMX)
    run = ProbeRun.objects.get(model=model)
    ((args, _),) = sent["probe"]
    assert args[0][0] == run.pk and args[0][1]["repo_id"] == model.repo_id
    from probe.tasks import probe_model
    from workers.celery import app

    # No call site names a queue: the routing table sends the probe to the Mac's.
    assert app.amqp.router.route({}, probe_model.name)["queue"].name == "mlx"
    fragment = response.content.decode()
    assert "Waiting for the Mac worker" in fragment and 'hx-trigger="every 3s"' in fragment
    assert f'hx-get="/m/{model.repo_id}/"' in fragment  # polls the page, not the action
    # A second click shows the same waiting probe instead of queueing another.
    with django_capture_on_commit_callbacks(execute=True):
        again = staff_client.post(f"/m/{model.repo_id}/probe")
    assert again.status_code == 302 and again["Location"] == f"/m/{model.repo_id}/"
    assert ProbeRun.objects.filter(model=model).count() == 1 and len(sent["probe"]) == 1


# --- a report from the real probe -------------------------------------------------------------


@pytest.mark.probe
def test_page_shows_a_report_from_the_real_probe(
    client: Client, catalog: Catalog, tmp_path: Path
) -> None:
    """A tiny hybrid model through probe.runner: the page shows the report's numbers."""
    from probe.runner import run_probe
    from probe.tinymodels import build_tiny_model
    from tests.probe.conftest import job

    model_dir = build_tiny_model(tmp_path / "tiny", "qwen3_next", "qwen3").path
    report = run_probe(job(model_dir, paths=["library", "library_checkpoints"]))
    assert report["status"] == "ok", report["error"]
    run = probed(catalog.changed, report)
    section = probe_section(client.get(f"/m/{catalog.changed.repo_id}/").content.decode())
    assert run.verdict and run.get_verdict_display() in section
    for result in report["results"]:
        pairs = result["pairs"]
        # No prediction in the job: the probe's own LCP (reusable tokens) stands in for it.
        predicted = sum(p["predicted_tokens"] or p["reusable_tokens"] for p in pairs)
        reused = sum(p["reused_tokens"] for p in pairs)
        held = sum(p["held_tokens"] for p in pairs)
        assert f"{predicted:,}</span> → {reused:,}" in section and f"of {held:,}" in section
        assert f"<code>{result['path']}</code>" in section
    assert report["machine"]["mlx_lm"] in section


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"results": [{"verdict": "miss", "reused_share": math.nan}]}, "not a number from 0 to 1"),
        ({"results": [{"verdict": "hit", "reused_share": 7.5}]}, "not a number from 0 to 1"),
        ({"results": [{"verdict": "hit", "reused_share": "abc"}]}, "not a number from 0 to 1"),
        ({"results": [{"verdict": "hit", "reused_share": math.inf}]}, "not a number from 0 to 1"),
        ({"results": "abc"}, "its results are not a list"),
    ],
)
def test_a_report_that_cannot_be_the_probes_is_an_error_with_why(
    client: Client, catalog: Catalog, change: dict[str, Any], reason: str
) -> None:
    """What the Mac worker sends is stored as sent, but a share outside 0 to 1 (NaN, which the
    broker's JSON carries, included) measured nothing: the probe ends as an error with why,
    and the next probe can be queued. Before, the write failed and left the probe running,
    holding one of the queue's places for good."""
    run = probed(catalog.unsafe, {**REPORT, **change})
    assert run.state == ProbeState.ERROR
    assert reason in run.error
    assert json.dumps(run.report, allow_nan=False)  # what a JSON column holds
    assert request_probe_once(catalog.unsafe).pk != run.pk
    page = client.get(f"/m/{catalog.unsafe.repo_id}/")
    assert page.status_code == 200
    assert not CatalogVerdict.objects.filter(model=catalog.unsafe).exclude(probe="none").exists()


@pytest.mark.parametrize(
    "change",
    [
        {"machine": "M2"},
        {"model": {"cache_layers": 5}},
        {"error": "bad \ud800 and \x00 text", "status": "error"},
        {"results": [{"verdict": "hit", "reused_share": 0.5, "prompt_size": "4k"}]},
        {
            "results": [
                {"verdict": "hit", "reused_share": 0.5, "exact_repeat": {"correctness": "no"}}
            ]
        },
        {"results": [{"verdict": "hit", "reused_share": 0.5, "pairs": "none"}]},
    ],
)
def test_fields_of_another_type_read_as_missing_and_every_page_answers(
    client: Client, catalog: Catalog, change: dict[str, Any]
) -> None:
    run = probed(catalog.unsafe, {**REPORT, **change})
    assert run.state in (ProbeState.DONE, ProbeState.ERROR)
    assert client.get(f"/m/{catalog.unsafe.repo_id}/").status_code == 200
    assert client.get(f"/api/models/{catalog.unsafe.repo_id}").status_code == 200
    assert client.get("/probes/").status_code == 200
