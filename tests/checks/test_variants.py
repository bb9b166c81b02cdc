"""Only what a template reads is varied, at the values it compares against."""

from __future__ import annotations

import pytest
from jinja2 import nodes

from checks.engine import run_check
from checks.rendering import CheckEnvironment, TemplateCache, compile_parsed
from checks.reports import SAFE, UNSAFE
from checks.sources import TemplateSource
from checks.variants import MAX_VARIANTS, kwargs_read, plan_variants


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
