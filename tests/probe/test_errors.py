"""Failures become a clear error in the report, and the worker goes on to the next job."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from probe import download
from probe.runner import describe_failure, run_probe
from tests.conftest import free_port
from tests.probe.conftest import by_path, job, weather_conversation


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A Hub endpoint on a closed local port, no token, a fresh HF_HOME, no telemetry."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_TOKEN", "")
    return endpoint


def assert_next_job_works(model_dir: Path) -> None:
    report = run_probe(job(model_dir, paths=["library"], prompt_sizes=[0]))
    assert report["status"] == "ok", report["error"]
    assert by_path(report)[("library", "forced")]["verdict"] == "hit"


@pytest.mark.probe
def test_model_that_fails_to_load(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(model_dirs["llama/chatml"], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "no_such_arch"}))
    report = run_probe(job(broken))
    assert report["status"] == "error"
    assert report["error"].startswith("RuntimeError: model failed to load")
    assert "no_such_arch" in report["error"]
    assert report["results"] == []
    assert report["job"]["repo_id"] == "tiny/test"
    assert report["machine"]["mlx"]
    assert_next_job_works(model_dirs["llama/chatml"])


@pytest.mark.probe
def test_model_with_truncated_weights(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "truncated"
    shutil.copytree(model_dirs["llama/chatml"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    report = run_probe(job(broken))
    assert report["status"] == "error"
    assert "model failed to load" in report["error"]
    assert_next_job_works(model_dirs["llama/chatml"])


def test_missing_model_dir(tmp_path: Path) -> None:
    report = run_probe(job(tmp_path / "nowhere"))
    assert report["status"] == "error"
    assert "does not exist" in report["error"]


@pytest.mark.probe
def test_download_that_breaks(offline_hub: str, model_dirs: dict[str, Path]) -> None:
    broken_job = job(Path("unused"))
    del broken_job["model_dir"]
    broken_job["download"] = {"endpoint": offline_hub}
    tic = time.monotonic()
    report = run_probe(broken_job)
    assert time.monotonic() - tic < 60
    assert report["status"] == "error"
    assert report["error"].startswith(f"cannot list files of tiny/test@{'0' * 40}")
    assert "Connection refused" in report["error"]
    assert_next_job_works(model_dirs["llama/chatml"])


def test_disk_budget_refuses_before_downloading(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def planned(spec: download.DownloadSpec) -> tuple[str, list[tuple[str, int]]]:
        return "a" * 40, [("model.safetensors", 5_000), ("config.json", 100)]

    monkeypatch.setattr(download, "planned_files", planned)
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: calls.append(a))
    budget_job = {**job(Path("unused"), disk_budget_bytes=4_000)}
    del budget_job["model_dir"]
    report = run_probe(budget_job)
    assert report["status"] == "error"
    assert "needs 5100 bytes for 2 files, over the disk budget of 4000 bytes" in report["error"]
    assert calls == []


def test_download_is_cleaned_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(download, "planned_files", lambda spec: ("b" * 40, [("config.json", 10)]))

    def fake_snapshot(repo_id: str, **kwargs: Any) -> str:
        target = Path(kwargs["local_dir"])
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        assert kwargs["revision"] == "b" * 40
        assert "*.py" not in kwargs["allow_patterns"]
        return str(target)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot)
    spec = download.DownloadSpec("org/model", work_dir=str(tmp_path), disk_budget_bytes=100)
    with download.downloaded_model(spec) as (path, commit):
        assert (path / "config.json").exists()
        assert commit == "b" * 40
    assert list(tmp_path.iterdir()) == []


def test_job_without_conversations() -> None:
    report = run_probe({"model_dir": "/nowhere", "conversations": {}})
    assert report == {**report, "status": "error", "error": "ValueError: job has no conversations"}


@pytest.mark.probe
def test_one_bad_conversation_does_not_stop_the_others(model_dirs: dict[str, Path]) -> None:
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    conversations = {"weather": weather_conversation(), "image": [image, image]}
    report = run_probe(
        job(model_dirs["llama/chatml"], paths=["library"], conversations=conversations)
    )
    assert report["status"] == "ok"
    results = {r["conversation"]: r for r in report["results"]}
    assert results["weather"]["verdict"] == "hit"
    assert results["image"]["verdict"] is None
    assert "Only 'text' content type is supported" in results["image"]["error"]


def test_out_of_memory_is_named_whatever_raised_it() -> None:
    metal = RuntimeError("[METAL] Command buffer execution failed: Insufficient Memory")
    assert describe_failure(metal).startswith("out of memory: RuntimeError: [METAL]")
    assert describe_failure(MemoryError()).startswith("out of memory: MemoryError")
    assert describe_failure(ValueError("bad")) == "ValueError: bad"


@pytest.mark.probe
def test_server_that_does_not_come_up_is_an_error_in_its_result(
    model_dirs: dict[str, Path],
) -> None:
    report = run_probe(
        job(model_dirs["llama/chatml"], paths=["library", "server"], server_startup_timeout_s=0)
    )
    assert report["status"] == "ok"
    results = by_path(report)
    assert results[("library", "forced")]["verdict"] == "hit"
    assert results[("server", "generated")]["error"] == (
        "ServerError: mlx_lm.server not healthy after 0 s"
    )
