"""Token-level checks in the service: a model whose tokenizer.json merges across the seam between
request and reply gets a different verdict from the same template checked on bytes alone."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from registry import pipeline
from registry.models import CheckRun, HubModel, TokenizerFile, Verdict
from registry.sync import sync_repo_ids
from registry.tasks import dispatch_template_changes
from tests.fakehub import FakeHub
from tests.fakehub.corpus import tokenizer_config
from tests.fakehub.fixtures import fake_hub, hub_settings
from tests.pipeline_data import SAFE_TEMPLATE
from tests.workerproc import wait_for

__all__ = ["fake_hub", "hub_settings"]


def newline_merging_tokenizer() -> str:
    """A tiny byte-level BPE in which "\\n\\n" is one token, as in real vocabularies."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(["assistant\n\nIt is sunny.\n\n", "user\n\nhi\n\n"] * 50, trainer)
    assert tokenizer.encode("\n\n").ids == [tokenizer.token_to_id("ĊĊ")]
    return str(tokenizer.to_str())


def publish(hub: FakeHub, repo_id: str, tokenizer_json: str | None) -> None:
    files = {"tokenizer_config.json": tokenizer_config(SAFE_TEMPLATE.encode(), None, "<|im_end|>")}
    if tokenizer_json is not None:
        files["tokenizer.json"] = tokenizer_json.encode()
    hub.store.create_repo(repo_id)
    hub.store.add_commit(repo_id, files, "Add files")


@pytest.mark.django_db(transaction=True)
def test_runs_are_per_template_and_tokenizer(
    fake_hub: FakeHub, hub_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[int] = []
    monkeypatch.setattr(pipeline, "send_check", sent.append)
    tokenizer = newline_merging_tokenizer()
    publish(fake_hub, "acme/bytes-only", None)
    publish(fake_hub, "acme/tokens-a", tokenizer)
    publish(fake_hub, "acme/tokens-b", tokenizer)
    sync_repo_ids(["acme/bytes-only", "acme/tokens-a", "acme/tokens-b"])

    pipeline.dispatch_template_changes()
    runs = CheckRun.objects.all()
    # One template, two tokenizers ("" = none): two checks, however many models share them.
    assert sorted(r.tokenizer_sha != "" for r in runs) == [False, True]
    assert len(sent) == 2
    assert pipeline.request_missing_checks() == 0


@pytest.mark.worker
def test_a_token_seam_makes_the_model_unsafe_and_the_tokenizer_is_fetched_once(
    celery_workers: Any, fake_hub: FakeHub, hub_settings: Any
) -> None:
    tokenizer = newline_merging_tokenizer()
    publish(fake_hub, "acme/bytes-only", None)
    publish(fake_hub, "acme/tokens-a", tokenizer)
    publish(fake_hub, "acme/tokens-b", tokenizer)
    sync_repo_ids(["acme/bytes-only", "acme/tokens-a", "acme/tokens-b"])
    fake_hub.reset_log()
    celery_workers(
        queues="default,checks",
        extra_env={"HF_ENDPOINT": fake_hub.url, "HF_TOKEN": "", "HF_REQUESTS_PER_5MIN": "100000"},
    )
    dispatch_template_changes.delay()
    wait_for(lambda: not HubModel.objects.filter(verdict=Verdict.PENDING).exists(), 90, "verdicts")

    verdicts = dict(HubModel.objects.values_list("repo_id", "verdict"))
    assert verdicts == {
        "acme/bytes-only": Verdict.SAFE,
        "acme/tokens-a": Verdict.UNSAFE,
        "acme/tokens-b": Verdict.UNSAFE,
    }
    token_run = CheckRun.objects.exclude(tokenizer_sha="").get()
    causes = {f["cause"] for f in token_run.report["failures"]}  # type: ignore[index]
    assert "token_seam" in causes
    assert TokenizerFile.objects.count() == 1
    downloads = [r.path for r in fake_hub.requests() if r.path.endswith("/tokenizer.json")]
    assert len(downloads) == 1
