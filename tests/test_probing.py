"""Probes end to end: queued here, measured by a database-less "Mac" worker, stored back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from registry import probes as probing
from registry.models import EventKind, HubModel, ModelEvent, ProbeRun, ProbeState
from tests.conftest import free_port
from tests.pipeline_data import SAFE_TEMPLATE, add_model
from tests.workerproc import wait_for
from workers.models import WorkerHeartbeat

CPU_JOB = {"prompt_sizes": [128], "paths": ["library"], "repeats": 1}


def report(*verdicts: str, status: str = "ok") -> dict[str, Any]:
    return {
        "schema_version": 1,
        "status": status,
        "machine": {"chip": "test"},
        "results": [
            {"verdict": v, "reused_share": share, "disagreement": v == "miss"}
            for v, share in zip(verdicts, (1.0, 0.4, 0.0, 1.0), strict=False)
        ],
    }


@pytest.mark.django_db
def test_the_worst_conversation_decides_and_a_flip_is_one_event() -> None:
    model = add_model("org/probed", SAFE_TEMPLATE)
    first = probing.request_probe(model, model_dir="/nonexistent")
    assert probing.store_report(first.pk, report("hit", "hit")).verdict == "hit"  # type: ignore[union-attr]
    second = probing.request_probe(model, model_dir="/nonexistent")
    stored = probing.store_report(second.pk, report("hit", "partial", "miss"))
    assert stored is not None
    assert (stored.verdict, stored.reused_share, stored.disagreement) == ("miss", 0.0, True)
    assert probing.store_report(second.pk, report("hit")) == stored  # a redelivery changes nothing
    events = ModelEvent.objects.filter(kind=EventKind.PROBE_CHANGED)
    assert [(e.data["old"], e.data["new"]) for e in events] == [("hit", "miss")]


@pytest.mark.django_db
def test_a_failed_probe_keeps_its_reason() -> None:
    model = add_model("org/broken", SAFE_TEMPLATE)
    run = probing.request_probe(model, model_dir="/nonexistent")
    stored = probing.store_report(run.pk, {"status": "error", "error": "model failed to load"})
    assert stored is not None
    assert (stored.state, stored.error) == (ProbeState.ERROR, "model failed to load")


@pytest.mark.worker
@pytest.mark.probe
def test_mac_worker_without_database_probes_a_model_and_reports_back(
    celery_workers: Any, tmp_path: Path
) -> None:
    from probe.tinymodels import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny", "llama", "chatml").path
    model = add_model("tiny/dense-chatml", SAFE_TEMPLATE)
    celery_workers(queues="default")
    # The Mac worker: only the mlx queue, and a database it cannot reach.
    mac = celery_workers(
        queues="mlx",
        pool="solo",
        extra_env={"DATABASE_URL": f"postgres://nobody@127.0.0.1:{free_port()}/none"},
        wait=False,
    )
    wait_for(
        lambda: WorkerHeartbeat.objects.filter(hostname__startswith=mac.name).first(),
        90,
        "the Mac worker's heartbeat, sent through the broker",
    )
    heartbeat = WorkerHeartbeat.objects.get(hostname__startswith=mac.name)
    assert heartbeat.queues == ["mlx"]
    assert {"chip", "mlx", "mlx_lm", "memory_bytes"} <= heartbeat.info.keys()

    broken = probing.request_probe(model, model_dir=str(tmp_path / "missing"), **CPU_JOB)
    good = probing.request_probe(model, model_dir=str(tiny), **CPU_JOB)
    wait_for(
        lambda: not ProbeRun.objects.waiting().exists(), 300, f"both probes ({mac.log()[-3000:]})"
    )
    broken.refresh_from_db()
    good.refresh_from_db()
    assert broken.state == ProbeState.ERROR and broken.error, broken.report
    assert good.state == ProbeState.DONE, good.error
    assert good.verdict == "hit"
    assert good.report is not None and good.report["results"]
    assert good.worker and good.machine.get("mlx")
    assert HubModel.objects.get(pk=model.pk).probe_runs.count() == 2
