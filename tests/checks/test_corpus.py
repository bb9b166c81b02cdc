"""Every corpus template gets a verdict; every disagreement with the reference is explained in
docs/engine.md, and nothing else disagrees."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from checks import CheckInput, SandboxPool, check_templates
from checks.reports import VERDICTS, TemplateReport
from tests.checks.conftest import CORPUS, corpus_entries, corpus_source

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
SECTION = "## Where we disagree with the reference verdicts"


def documented_disagreements() -> dict[str, tuple[str, str]]:
    """Rows `| template.jinja | reference | ours | … |` of the section in docs/engine.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\|\s*`([^`]+\.jinja)`\s*\|\s*(\w+)\s*\|\s*(\w+)\s*\|", line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


@pytest.fixture(scope="module")
def corpus_reports(pool: SandboxPool) -> dict[str, TemplateReport]:
    entries = corpus_entries()
    inputs = [CheckInput(corpus_source(e), e["file"]) for e in entries]
    reports = check_templates(inputs, pool=pool, cache=None)
    return {report.file: report for report in reports}


def reference() -> dict[str, dict[str, Any]]:
    results = json.loads((CORPUS / "expected.json").read_text())["results"]
    return {r["file"]: r for r in results}


def test_every_corpus_template_gets_a_verdict(corpus_reports: dict[str, TemplateReport]) -> None:
    assert len(corpus_reports) == len(corpus_entries()) == 105
    for file, report in corpus_reports.items():
        assert report.verdict in VERDICTS, file
        assert report.summary, file
        assert report.sha256 == next(e["sha256"] for e in corpus_entries() if e["file"] == file)


def test_disagreements_are_exactly_the_documented_ones(
    corpus_reports: dict[str, TemplateReport],
) -> None:
    actual = {}
    for file, expected in reference().items():
        theirs = expected["cache_verdict"].lower()
        ours = corpus_reports[file].verdict
        if theirs != ours:
            actual[file] = (theirs, ours)
    assert actual == documented_disagreements()


def test_agreement_counts_match_the_doc(corpus_reports: dict[str, TemplateReport]) -> None:
    agree = sum(
        corpus_reports[f].verdict == r["cache_verdict"].lower() for f, r in reference().items()
    )
    assert f"agree on {agree} of 105" in DOC.read_text(encoding="utf-8")


def test_no_template_errors_for_a_hostile_reason(corpus_reports: dict[str, TemplateReport]) -> None:
    # Real templates never hit the sandbox's limits: an error here would be a limit set too low.
    limits = ("exceeded", "memory", "output over", "recursion", "sandbox")
    reasons = Counter(r.reason for r in corpus_reports.values() if r.reason)
    assert not [reason for reason in reasons if any(word in reason for word in limits)]


def test_seed_check_artifact_is_recognised(corpus_reports: dict[str, TemplateReport]) -> None:
    """Most of the literal check's tool-shape failures are the generation-prompt artifact."""
    shapes = Counter(
        s.classification
        for r in corpus_reports.values()
        for s in r.seed_check
        if s.status == "fail" and s.shape in ("single_tool_call", "parallel_tool_call")
    )
    assert shapes["generation_prompt_artifact"] > shapes["history"] + shapes["generation_prompt"]


def test_every_failure_names_its_template_line_and_segment(
    corpus_reports: dict[str, TemplateReport],
) -> None:
    failures = [f for r in corpus_reports.values() for f in r.failures]
    assert len(failures) > 500
    assert all(f.template_lines and f.segment and f.segment_next for f in failures)
    assert all(f.byte_offset is not None for f in failures)
