"""A diff page's renders come from the sandbox, whole, with who wrote each character."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from checks import (
    PairRequest,
    PairUnavailable,
    SandboxLimits,
    SandboxPool,
    TemplateSource,
    render_pair,
)
from checks.sandbox import SandboxError

DEMO = Path(__file__).resolve().parents[2] / "registry" / "demo"
MARKER = (DEMO / "moving-marker-unsafe.jinja").read_text()
# Fine for one request; loops for ever once the conversation has a second user turn.
SLOW_LATER = (
    "{% if messages | selectattr('role', 'equalto', 'user') | list | length > 1 %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
)

# Writes every reasoning it is sent.
KEEPS_REASONING = (
    "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}<think>"
    "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    pool = SandboxPool(size=1, limits=SandboxLimits(cpu_seconds=2.0))
    yield pool
    pool.close()


def pair(index: int = 1, session: str = "chat") -> PairRequest:
    return PairRequest("default", (), session, "dict", index)


def test_both_renders_whole_with_every_character_attributed(pool: SandboxPool) -> None:
    source = TemplateSource({"default": MARKER}, {"bos_token": "<s>"})
    data = render_pair(source, pair(), pool=pool)
    before, after = data["before"], data["after"]
    assert before.startswith("<s>") and "[LATEST]" in before
    assert not after.startswith(before)  # the marker moved: that is why the page exists
    covered = sorted((s["start"], s["end"]) for s in data["after_spans"])
    assert covered[0][0] == 0 and covered[-1][1] == len(after)
    assert all(s["line"] >= 1 for s in data["after_spans"] if s["end"] > s["start"])
    assert data["reply"]["role"] == "assistant"
    assert data["messages"][-1]["role"] == "user"


def test_a_pair_that_does_not_exist_is_unavailable(pool: SandboxPool) -> None:
    source = TemplateSource({"default": MARKER})
    with pytest.raises(PairUnavailable, match="not part of session"):
        render_pair(source, pair(index=9), pool=pool)
    with pytest.raises(PairUnavailable, match="no session named"):
        render_pair(source, pair(session="nope"), pool=pool)


def test_the_pair_is_rendered_as_the_check_rendered_it(pool: SandboxPool) -> None:
    """The typical client drops reasoning from history; the model's reply still carried it.
    With the reasoning_content client the history keeps it: the page shows what was checked."""
    source = TemplateSource({"default": KEEPS_REASONING})
    typical = render_pair(source, pair(session="reasoning_history"), pool=pool)
    assert "<think>" not in typical["after"]
    assert typical["reply"]["reasoning_content"]  # what the model emitted
    sent = PairRequest("default", (), "reasoning_history", "dict", 2, "reasoning_content")
    kept = render_pair(source, sent, pool=pool)
    assert "<think>" in kept["before"]  # the last assistant message keeps its reasoning
    with pytest.raises(PairUnavailable, match="no client profile named"):
        render_pair(source, PairRequest("default", (), "chat", "dict", 1, "nobody"), pool=pool)


def test_a_template_that_loops_is_stopped_and_the_pool_goes_on(pool: SandboxPool) -> None:
    source = TemplateSource({"default": SLOW_LATER})
    # Stopped by its CPU budget (2 s of the worker's CPU), however busy the machine is.
    with pytest.raises(SandboxError, match="exceeded its CPU budget of 2 s"):
        render_pair(source, pair(), pool=pool)
    data = render_pair(TemplateSource({"default": MARKER}), pair(), pool=pool)
    assert data["after"]
