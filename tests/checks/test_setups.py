"""Verdicts for the reader's setup: prompt vs reply reuse, client profiles, engine cache classes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.clients import PROFILE_NAMES, PROFILES
from checks.engine import run_check
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import SAFE, SAFE_WHERE_RENDERABLE, UNSAFE, ClientResult, TemplateReport
from checks.reuse import (
    BLOCK,
    HYBRID,
    HYBRID_CHECKPOINTS,
    TRIMMABLE,
    Stored,
    bar,
    reused,
    reused_by_class,
)
from checks.setups import Setup, SetupError, is_chosen, setup_verdict
from checks.sources import TemplateSource
from tests.checks.conftest import CHATML
from tests.diagnose_cases import MARKER

# Qwen3 style: reasoning is written only for assistant turns after the last user message, so a
# tool round's reasoning vanishes from history once the next user turn arrives.
REASONING_AFTER_LAST_USER = """{%- set ns = namespace(last=-1) -%}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif -%}
{% endfor -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' and m.reasoning_content and loop.index0 > ns.last -%}
<assistant><think>{{ m.reasoning_content }}</think>{{ m.content }}</s>
{%- else -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""

# Mistral style: reasoning comes back only as {"type": "thinking"} content chunks.
THINKING_CHUNKS = """{%- for m in messages -%}
{%- if m.content is string -%}
<{{ m.role }}>{{ m.content }}</s>
{%- else -%}
<{{ m.role }}>{% for c in m.content %}
{%- if c.type == 'thinking' %}[THINK]{{ c.thinking }}[/THINK]
{%- elif c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}</s>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""

# Tool-call arguments concatenated as text: objects make it raise, JSON strings render.
STRING_ARGUMENTS = """{%- for m in messages -%}
<{{ m.role }}>{{ m.content }}
{%- for call in m.tool_calls or [] %}[CALL]
{{- call.function.name + ' ' + call.function.arguments }}{% endfor -%}
</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""

# Line 2 marks the last user message: the prefix breaks on every turn, on every engine.
MOVING_MARKER = """{%- for m in messages -%}
{%- if loop.last and m.role == 'user' %}[LAST]{% endif -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


# Qwen3 style: with enable_thinking false the generation prompt closes an empty think block
# that history never writes, so that setting breaks; the template's defaults do not.
THINKING_OFF_BREAKS = """{%- for m in messages -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>
{%- if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}
{%- endif -%}
"""


# DeepSeek R1 style: arguments added to a string, so objects make tool conversations raise;
# with strings, the newest call is marked, and the mark moves once a turn is added.
OBJECTS_OR_NOTHING = """{%- for m in messages -%}
{%- set recent = loop.revindex0 < 2 -%}
<{{ m.role }}>{{ m.content }}
{%- for call in m.tool_calls or [] %}[CALL{% if recent %} recent{% endif %}]
{{- call.function.name + ' ' + call.function.arguments }}{% endfor -%}
</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


def report_for(text: str) -> TemplateReport:
    return run_check(TemplateSource({"default": text}), TemplateCache(CheckEnvironment()))


def client(report: TemplateReport, name: str) -> ClientResult:
    return next(c for c in report.variants[0].clients if c.profile == name)


def test_every_variant_lists_every_client_profile() -> None:
    report = report_for(CHATML)
    for variant in report.variants:
        assert tuple(c.profile for c in variant.clients) == PROFILE_NAMES
        assert variant.clients[0].verdict == variant.verdict
    # ChatML reads no reasoning, no tool calls, no chunks: nothing differs, and it says why.
    assert client(report, "reasoning_content").note == (
        "the template never writes reasoning into history"
    )
    assert client(report, "thinking_chunks").note
    assert client(report, "arguments_strings").note == "the template never reads tool calls"
    assert client(report, "typical").engines == dict.fromkeys(
        (TRIMMABLE, BLOCK, HYBRID, HYBRID_CHECKPOINTS), SAFE
    )
    assert client(report, "typical").reply_reused is True


def test_a_client_that_sends_reasoning_back_breaks_what_the_typical_client_keeps() -> None:
    report = report_for(REASONING_AFTER_LAST_USER)
    assert report.verdict == SAFE
    kept = client(report, "reasoning_content")
    assert kept.verdict == UNSAFE
    broken = [p for s in kept.sessions for p in s.pairs if p.status == "fail"]
    assert {(p.session, p.index, p.cause) for p in broken} == {
        ("reasoning_tool_round", 2, "history")
    }
    assert "With a client that sends reasoning back as reasoning_content, the prompt breaks" in (
        report.summary
    )
    # Sessions without reasoning are the same requests for both clients: not re-run.
    chat = next(s for s in kept.sessions if s.session == "chat")
    assert chat is next(s for s in report.variants[0].sessions if s.session == "chat")


def test_thinking_chunks_are_a_client_profile_where_the_template_reads_them() -> None:
    report = report_for(THINKING_CHUNKS)
    chunks = client(report, "thinking_chunks")
    assert chunks.note == ""
    # Sent back as chunks, the reasoning is written where the model emitted it: reply reused.
    assert chunks.reply_reused is True
    assert chunks.engines[HYBRID] == SAFE
    # Dropped (or sent in a field this template never reads), the reply is re-read every turn.
    typical = client(report, "typical")
    assert typical.reply_reused is False and typical.verdict == SAFE
    assert typical.engines[HYBRID] == UNSAFE
    assert client(report, "reasoning_content").reply_reused is False
    # A template that does not compare a chunk's type with 'thinking' cannot take chunks.
    unread = client(report_for(REASONING_AFTER_LAST_USER), "thinking_chunks")
    assert unread.verdict is None
    assert unread.note == "the template never reads reasoning sent as thinking chunks"


def test_argument_profiles_render_only_their_own_form() -> None:
    report = report_for(STRING_ARGUMENTS)
    assert client(report, "typical").verdict == SAFE  # falls back to strings
    objects = client(report, "arguments_objects")
    assert objects.verdict == SAFE_WHERE_RENDERABLE
    refused = {s.session for s in objects.sessions if not s.rendered}
    assert refused == {"tool_round", "parallel_tool_calls", "tool_rounds", "reasoning_tool_round"}
    assert client(report, "arguments_strings").verdict == SAFE


def test_engine_classes_per_turn() -> None:
    marker = client(report_for(MOVING_MARKER), "typical")
    assert set(marker.engines.values()) == {UNSAFE}
    chunks = report_for(THINKING_CHUNKS)
    pair = next(
        p
        for s in chunks.variants[0].sessions
        if s.session == "reasoning_history"
        for p in s.pairs
        if p.index == 1
    )
    assert (pair.prompt_reuse, pair.reply_reuse, pair.unit) == (True, False, "bytes")
    assert pair.reuse is not None and pair.needed is not None and pair.prompt_units
    assert pair.reuse[TRIMMABLE] == pair.prompt_units  # up to the end of request 1
    assert pair.reuse[HYBRID] == 0  # the stored sequence ends with a reply history lacks
    assert pair.reuse[HYBRID_CHECKPOINTS] == pair.prompt_units - 1  # its last checkpoint
    assert pair.reuse[BLOCK] is None  # blocks are counted in tokens: needs a tokenizer


def test_round_trip_keeps_the_setup_results() -> None:
    report = report_for(REASONING_AFTER_LAST_USER)
    again = TemplateReport.from_dict(report.to_dict())
    assert again == report
    assert again.variants[0].clients[1].sessions


# The estimator alone.


def test_each_class_on_a_reply_that_history_rewrites() -> None:
    prompt, reply = list(range(100)), [500, 501, 502]
    stored = [Stored(prompt + reply, checkpoints=(40, 99))]
    nxt = prompt + [900, 901] + list(range(200, 230))
    assert reused(TRIMMABLE, stored, nxt) == 100
    assert reused(BLOCK, stored, nxt) == 96
    assert reused(HYBRID, stored, nxt) == 0
    assert reused(HYBRID_CHECKPOINTS, stored, nxt) == 99
    # ...and on one that keeps it: everything the engine held comes back.
    same = prompt + reply + list(range(200, 230))
    assert reused_by_class(stored, same) == {
        TRIMMABLE: 103,
        BLOCK: 96,
        HYBRID: 103,
        HYBRID_CHECKPOINTS: 103,
    }
    assert bar(HYBRID, stored[0], 100, len(nxt)) == 103
    assert bar(HYBRID_CHECKPOINTS, stored[0], 100, len(nxt)) == 99
    assert bar(BLOCK, stored[0], 100, len(nxt)) == 96


sequences = st.lists(st.integers(0, 3), max_size=40)


@given(
    st.lists(st.tuples(sequences, st.lists(st.integers(0, 40), max_size=3)), max_size=4),
    sequences,
    st.sampled_from([1, 4, 16]),
)
def test_estimates_are_ordered_and_bounded(
    entries: list[tuple[list[int], list[int]]], prompt: list[int], block: int
) -> None:
    stored = [Stored(seq, tuple(c for c in marks if c <= len(seq))) for seq, marks in entries]
    got = reused_by_class(stored, prompt, block)
    limit = max(len(prompt) - 1, 0)
    assert 0 <= got[HYBRID] <= got[HYBRID_CHECKPOINTS] <= got[TRIMMABLE] <= limit
    assert got[BLOCK] <= got[TRIMMABLE] and got[BLOCK] % block == 0
    # What a class reuses is really a shared prefix of some stored sequence.
    for n in got.values():
        assert n == 0 or any(seq[:n] == prompt[:n] for seq, _ in entries)


def test_a_safe_setting_names_the_one_that_breaks_and_why_the_headline_says_breaks() -> None:
    """The headline counts every setting a caller meets, so "Breaks the cache" sits above a
    typical setup that is cache-safe: the setup's sentence says which setting breaks."""
    report = report_for(THINKING_OFF_BREAKS)
    assert report.verdict == UNSAFE
    typical = setup_verdict(report, Setup())
    assert typical is not None and typical.verdict == SAFE
    assert "With enable_thinking=false it breaks, and the verdict at the top counts it:" in (
        typical.sentence
    )
    on = setup_verdict(report, Setup(thinking="on"))
    assert on is not None and on.verdict == SAFE
    assert "With enable_thinking=false it breaks: choose that setting" in on.sentence
    off = setup_verdict(report, Setup(thinking="off"))
    assert off is not None and off.verdict == UNSAFE
    plain = setup_verdict(report_for(CHATML), Setup())
    assert plain is not None and "it breaks" not in plain.sentence


def test_a_client_is_named_in_words_that_follow_a_client_that() -> None:
    """Every sentence says "a client that <label>": each label starts with what it does."""
    for profile in PROFILES:
        assert profile.label.split()[0] in {"drops", "sends"}, profile.label


def test_a_client_under_which_the_template_refuses_conversations_is_not_plain_advice() -> None:
    """DeepSeek R1 style: arguments as objects keep the prompt but the template refuses
    some conversations that way; the advice says so rather than "cache-safe"."""
    report = report_for(OBJECTS_OR_NOTHING)
    objects = client(report, "arguments_objects")
    assert objects.verdict == SAFE_WHERE_RENDERABLE
    assert "it is cache-safe only in the conversations that render" in report.summary
    chosen = setup_verdict(report, Setup(client="arguments_strings"))
    assert chosen is not None and chosen.verdict == UNSAFE
    assert (
        "use a client that sends tool-call arguments as objects (what vLLM and SGLang pass "
        "after parsing) (the template then refuses some conversations)"
    ) in chosen.sentence


def test_a_setup_where_some_conversations_do_not_render_names_them_in_any_surface() -> None:
    """The sentence is printed by the CLI as well as on the page: it names the conversations
    that do not render instead of pointing at a table only the page has."""
    report = report_for(STRING_ARGUMENTS)
    chosen = setup_verdict(report, Setup(client="arguments_objects"))
    assert chosen is not None and chosen.verdict == SAFE_WHERE_RENDERABLE
    assert "matrix" not in chosen.sentence
    assert (
        "4 of the conversations replayed do not render at all (parallel_tool_calls, "
        "reasoning_tool_round, tool_round, tool_rounds): this verdict is for the others."
    ) in chosen.sentence


def test_a_setup_value_is_read_without_the_spaces_around_it() -> None:
    """A pasted link (`?engine=%20hybrid`, `?thinking=off%20`): the catalog applied it, the
    model page ignored it, the API refused it. Stripped, then validated exactly, everywhere."""
    assert Setup.parse({"engine": " hybrid", "thinking": "off "}) == Setup(
        engine=HYBRID, thinking="off"
    )
    assert is_chosen({"engine": "\thybrid\n"})
    # Only spaces: as blank as `?client=`, the headline's value and no setup chosen.
    assert not is_chosen({"client": "  ", "engine": None})
    assert Setup.parse({"client": "  "}) == Setup()
    # Still unknown once stripped: the same error as before, naming the value without spaces.
    with pytest.raises(SetupError, match=r"unknown engine 'quantum': use one of trimmable"):
        Setup.parse({"engine": " quantum "})
    # Inside the value, a space is part of it.
    with pytest.raises(SetupError, match="unknown client"):
        Setup.parse({"client": "reasoning content"})


def test_a_link_to_a_setup_of_headline_values_still_chooses_it() -> None:
    """The typical client and the trimmable engine are left out of a link; a setup of the
    headline's values alone is spelt `?thinking=default`. It was spelt "", the headline, which
    counts every setting: the catalog's rows and the model page's chips linked away from the
    setup they were for."""
    assert Setup().query() == "?thinking=default"
    assert Setup(thinking="on").query(thinking="default") == "?thinking=default"
    assert Setup(engine=HYBRID).query() == "?engine=hybrid"
    assert Setup(client="reasoning_content", engine=HYBRID, thinking="on").query() == (
        "?client=reasoning_content&engine=hybrid&thinking=on"
    )
    assert Setup(engine=HYBRID).params == {"engine": HYBRID}
    assert Setup().params == {"thinking": "default"}


def test_a_setup_that_renders_nothing_says_why() -> None:
    """Named templates with no `default`, none `tool_use`: a caller who names none gets
    transformers' error for every request, and the setup's sentence (the CLI's gate line) says
    so rather than only that nothing renders."""
    report = run_check(
        TemplateSource({"rag": CHATML, "code": CHATML}), TemplateCache(CheckEnvironment())
    )
    assert report.verdict == SAFE_WHERE_RENDERABLE
    chosen = setup_verdict(report, Setup.parse({"thinking": "default"}))
    assert chosen is not None
    assert (chosen.verdict, chosen.sentence) == (
        "error",
        "With no kwargs, nothing renders (ValueError: This model has multiple chat templates "
        "with no default specified! Please either pass a chat template or the name of the "
        "template you wish to use to the `chat_template` argument. Available template names are "
        "['code', 'rag']).",
    )


def test_the_fix_that_is_another_named_template_names_it() -> None:
    """The default template breaks the cache and `rag` keeps it: the advice is to name `rag`,
    not to pass no chat_template_kwargs (which gets the default that breaks)."""
    report = run_check(
        TemplateSource({"default": MARKER, "rag": CHATML}), TemplateCache(CheckEnvironment())
    )
    chosen = setup_verdict(report, Setup.parse({"thinking": "default"}))
    assert chosen is not None and chosen.verdict == UNSAFE
    assert chosen.sentence.endswith(' To keep the cache: pass chat_template="rag".')
