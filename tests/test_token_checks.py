"""Token-level checks in the service: a model whose tokenizer.json merges across the seam between
request and reply gets a different verdict from the same template checked on bytes alone."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from registry import pipeline
from registry.hub import HubClient, HubUnavailable
from registry.models import CheckRun, HubModel, TemplateSnapshot, TokenizerFile, Verdict
from registry.sync import sync_repo_ids
from registry.tasks import dispatch_template_changes
from registry.tokenizer_files import TokenizerUnavailable, tokenizer_text
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


@pytest.mark.django_db
def test_a_tokenizer_gone_from_every_commit_known_to_hold_it_is_unavailable_not_retried(
    fake_hub: FakeHub, hub_settings: Any
) -> None:
    """History rewritten on the Hub (a squash, a force-push): the commit the registry knows a
    tokenizer.json from answers 404. The check then runs on bytes alone, instead of waiting
    for a file that will never come; a Hub that fails (500) is still retried later."""
    publish(fake_hub, "acme/squashed", "{}")
    sync_repo_ids(["acme/squashed"])
    [sha] = TemplateSnapshot.objects.values_list("tokenizer_json_sha", flat=True)
    repo = fake_hub.store.get("acme/squashed")
    assert repo is not None
    fake_hub.store.add_commit("acme/squashed", dict(repo.head.files), "Squashed history")
    del repo.commits[:-1]  # the commit the registry knows is gone
    fake_hub.inject("500", times=20, match="tokenizer.json")
    with pytest.raises(HubUnavailable, match="500"):
        tokenizer_text(sha, HubClient(sleep=lambda seconds: None, max_attempts=2))
    fake_hub.clear_faults()
    with pytest.raises(TokenizerUnavailable, match="gone from the Hub"):
        tokenizer_text(sha, HubClient(sleep=lambda seconds: None, max_attempts=2))
    assert not TokenizerFile.objects.exists()
