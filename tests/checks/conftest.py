"""Shared fixtures for the check engine's tests: the reference corpus and a sandbox pool."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from checks import SandboxLimits, SandboxPool
from checks.sources import TemplateSource, load_source
from tests.conftest import CORPUS_DIR, NO_CORPUS, corpus_available, require_corpus

# A plain ChatML template: cache-safe in every session, the baseline many tests compare with.
# Reasoning is kept only on the final assistant message: earlier turns lose it,
# so the reply the model emitted is not written back (the prompt still carries over).
REASONING_ON_LAST = """{%- for m in messages -%}
{%- if m.role == 'assistant' and m.reasoning_content and loop.last -%}
<assistant><think>{{ m.reasoning_content }}</think>{{ m.content }}</s>
{%- else -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The corpus lives beside the repository (../shared/corpus), never inside it.
CORPUS = CORPUS_DIR


def corpus_entries() -> list[dict[str, Any]]:
    """Every corpus template's index entry (skips the calling test without the corpus)."""
    entries: list[dict[str, Any]] = json.loads((require_corpus() / "index.json").read_text())
    return sorted(entries, key=lambda entry: entry["file"])


def corpus_cases(step: int = 1) -> list[Any]:
    """Parameters for a test over corpus templates; one skipped case where there is no corpus."""
    if not corpus_available():
        return [pytest.param(None, id="no-corpus", marks=pytest.mark.skip(reason=NO_CORPUS))]
    entries: list[dict[str, Any]] = json.loads((CORPUS / "index.json").read_text())
    entries = sorted(entries, key=lambda entry: entry["file"])[::step]
    return [pytest.param(entry, id=entry["file"]) for entry in entries]


def corpus_source(entry: dict[str, Any]) -> TemplateSource:
    """A corpus template with the bos/eos tokens its index records."""
    tokens = {name: entry[name] for name in ("bos_token", "eos_token") if entry.get(name)}
    return load_source(CORPUS / "templates" / entry["file"], tokens)


@pytest.fixture(scope="session")
def pool() -> Iterator[SandboxPool]:
    sandbox = SandboxPool(size=2, limits=SandboxLimits(cpu_seconds=10.0))
    yield sandbox
    sandbox.close()
