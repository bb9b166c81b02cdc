"""Only what a template reads is varied, at the values it compares against."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from jinja2 import nodes
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from checks.conversations import SESSIONS, TOOLS
from checks.engine import run_check
from checks.rendering import CheckEnvironment, TemplateCache, compile_parsed
from checks.reports import SAFE, SAFE_WHERE_RENDERABLE, UNSAFE
from checks.sources import TemplateSource
from checks.variants import MAX_VARIANTS, kwargs_read, plan_variants
from tests.checks.conftest import CHATML


def labels(text: str, **named: str) -> list[str]:
    environment = CheckEnvironment()
    asts = {"default": environment.parse(text)}
    asts.update({name: environment.parse(body) for name, body in named.items()})
    return [v.label for v in plan_variants(asts)]


def test_a_template_that_never_reads_enable_thinking_gets_one_variant() -> None:
    assert labels("{% for m in messages %}{{ m.content }}{% endfor %}") == ["no kwargs"]


def test_enable_thinking_unset_false_true() -> None:
    text = (
        "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}"
    )
    assert labels(text) == ["no kwargs", "enable_thinking=false", "enable_thinking=true"]


def test_other_kwargs_at_their_compared_values_or_as_booleans() -> None:
    text = (
        "{% set effort = reasoning_effort | default('medium') %}"
        "{% if effort == 'high' %}H{% elif effort == 'low' %}L{% endif %}"
        "{% if enable_thinking %}T{% endif %}{% if preserve_thinking %}P{% endif %}"
        "{% set think_budget = 3 %}{{ think_budget }}"
    )
    # Unset reasoning_effort is the template's default ("medium"); booleans are also tried with
    # thinking on, where they matter.
    assert labels(text) == [
        "no kwargs",
        "enable_thinking=false",
        "enable_thinking=true",
        "preserve_thinking=true",
        "enable_thinking=true, preserve_thinking=true",
        "preserve_thinking=false",
        "enable_thinking=true, preserve_thinking=false",
        'reasoning_effort="high"',
        'reasoning_effort="low"',
    ]


def test_variables_the_template_sets_itself_are_not_kwargs() -> None:
    environment = CheckEnvironment()
    text = (
        "{% for m in messages %}{% set reasoning_text = m.reasoning_content %}{% endfor %}"
        "{% if keep_thinking is not defined %}{% set keep_thinking = false %}{% endif %}"
        "{{ keep_thinking }}"
    )
    assert kwargs_read(environment.parse(text)) == ["keep_thinking"]


def test_named_templates_follow_transformers_selection() -> None:
    assert labels("a", tool_use="{{ tools }}", rag="{{ documents }}") == [
        "no kwargs",
        "rag: no kwargs",
    ]


def test_the_number_of_variants_is_bounded() -> None:
    text = "{% if enable_thinking %}a{% endif %}" + "".join(
        f"{{% if think_{i} %}}x{{% endif %}}" for i in range(12)
    )
    found = labels(text)
    assert len(found) == MAX_VARIANTS
    assert found[:3] == ["no kwargs", "enable_thinking=false", "enable_thinking=true"]


# The generation prompt closes an empty think block history never writes, but only for the
# settings the condition on line 4 selects.
EFFORT_GATED = """{%- for m in messages -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% if CONDITION %}<think></think>{% endif %}{% endif -%}
"""


@pytest.mark.parametrize(
    ("condition", "values"),
    [
        ("reasoning_effort == 'high'", ["high"]),
        ("reasoning_effort in ['high', 'low']", ["high", "low"]),
        ("reasoning_effort in ('high', 'low')", ["high", "low"]),
    ],
)
def test_values_in_a_list_are_varied_like_an_equality(condition: str, values: list[str]) -> None:
    # The compiler folds a constant list into one Const in place; the analysis must still see the
    # list as written, whichever way the engine got its AST (run_check compiles it first).
    text = EFFORT_GATED.replace("CONDITION", condition)
    report = run_check(TemplateSource({"default": text}), TemplateCache(CheckEnvironment()))
    verdicts = {v.label: v.verdict for v in report.variants}
    assert verdicts == {
        "no kwargs": SAFE,
        **{f'reasoning_effort="{value}"': UNSAFE for value in values},
    }
    for value in values:
        assert f'With reasoning_effort="{value}", the generation prompt' in report.summary


def test_compiling_leaves_the_analysed_ast_as_written() -> None:
    compiled = compile_parsed(CheckEnvironment(), "{{ x in ['a', 'b'] }}")
    assert compiled.ast.find(nodes.List) is not None
    assert compiled.template.render(x="b") == "True"


def test_values_in_a_list_are_found_on_an_ast_that_was_never_compiled() -> None:
    # Without the compiler's names, kwargs_read asks jinja2.meta, which runs the code generator
    # (and its constant folding) on the tree: the list must survive that too.
    text = "{% if reasoning_effort not in ('xhigh', 'medium', 'low') %}{{ raise_exception('x') }}"
    text += "{% endif %}"
    assert labels(text) == [
        "no kwargs",
        'reasoning_effort="xhigh"',
        'reasoning_effort="medium"',
        'reasoning_effort="low"',
    ]


# Requests with tools see a tools line, so this one is told from the plain ChatML `rag`.
TOOL_USE = "{% if tools %}tools: {{ tools | length }}\n{% endif %}" + CHATML
# `loop.last` writes a marker on the newest message only: every pair breaks.
MARKED = "{% for m in messages %}{% if loop.last %}[LAST]{% endif %}{{ m.content }}\n{% endfor %}"


def transformers_pick(templates: dict[str, str], tools: list[Any] | None) -> str:
    """The template text `apply_chat_template` renders when the caller names none, or the
    error it raises: transformers' own choice among named templates."""
    tokenizer = SimpleNamespace(chat_template=dict(templates))
    try:
        return str(PreTrainedTokenizerBase.get_chat_template(tokenizer, None, tools))  # type: ignore[arg-type]
    except ValueError as exc:
        return f"ValueError: {exc}"


def test_named_templates_without_a_default_are_each_checked_by_name() -> None:
    environment = CheckEnvironment()
    asts = {"tool_use": environment.parse("{{ tools }}"), "rag": environment.parse("{{ x }}")}
    # `default` stands for the caller who names no template; every name is checked on its own.
    assert [(v.template_name, v.label) for v in plan_variants(asts)] == [
        ("default", "no kwargs"),
        ("tool_use", "tool_use: no kwargs"),
        ("rag", "rag: no kwargs"),
    ]


def test_without_a_default_a_request_renders_unnamed_only_where_transformers_picks() -> None:
    templates = {"tool_use": TOOL_USE, "rag": MARKED}
    report = run_check(TemplateSource(templates), TemplateCache(CheckEnvironment()))
    unnamed = next(v for v in report.variants if v.template_name == "default" and not v.kwargs)
    by_name = {v.template_name: v for v in report.variants if v is not unnamed}
    assert set(by_name) == {"tool_use", "rag"}
    for session, result in zip(SESSIONS, unnamed.sessions, strict=True):
        picked = transformers_pick(templates, TOOLS if session.uses_tools else None)
        if picked.startswith("ValueError: "):
            # No server renders it without a name: not a verdict, the reason transformers gives.
            assert not session.uses_tools
            assert (result.rendered, result.error) == (False, picked)
        else:
            assert picked == TOOL_USE
            assert result.rendered
            # Rendered as the `tool_use` template renders it when named: the same pairs.
            same = next(s for s in by_name["tool_use"].sessions if s.session == session.name)
            assert result.pairs == same.pairs
    assert unnamed.verdict == SAFE_WHERE_RENDERABLE
    # Named, each template renders every conversation: `rag` breaks the cache, and so the report.
    assert (by_name["tool_use"].verdict, by_name["rag"].verdict) == (SAFE, UNSAFE)
    assert report.verdict == UNSAFE
    assert report.summary.startswith(
        "No default template: transformers renders a request without tools only when the "
        'caller names a template (chat_template="rag" or "tool_use"); with tools it uses '
        '"tool_use". '
    )
    # What keeps the cache is a name to pass, not "the default settings".
    assert 'Cache-safe with tool_use: no kwargs (pass chat_template="tool_use").' in report.summary
    assert "With rag: no kwargs, earlier messages are re-rendered" in report.summary


@pytest.mark.parametrize(
    ("templates", "refused"),
    [
        ({"tool_use": TOOL_USE, "rag": CHATML}, {"chat", "chat_no_system", "padded_content"}),
        ({"rag": CHATML, "code": TOOL_USE}, {s.name for s in SESSIONS}),
        ({"tool_use": TOOL_USE}, {"chat", "chat_no_system", "padded_content"}),
    ],
    ids=["tool_use-and-rag", "no-tool_use", "tool_use-alone"],
)
def test_without_a_default_safe_names_are_safe_only_where_it_renders(
    templates: dict[str, str], refused: set[str]
) -> None:
    """Cache-safe under every name, but a caller who names none gets an error for some
    requests (all of them without `tool_use`): not "Cache-safe" outright."""
    report = run_check(TemplateSource(templates), TemplateCache(CheckEnvironment()))
    unnamed = next(v for v in report.variants if v.template_name == "default")
    assert {s.session for s in unnamed.sessions if not s.rendered} >= refused
    assert all(
        s.error == transformers_pick(templates, None) for s in unnamed.sessions if not s.rendered
    )
    assert {v.verdict for v in report.variants if v is not unnamed} == {SAFE}
    assert report.verdict == SAFE_WHERE_RENDERABLE
    names = " or ".join(f'"{name}"' for name in sorted(templates))
    assert report.summary.startswith("No default template: transformers renders a request ")
    assert f"(chat_template={names})" in report.summary
    assert report.reason is None
