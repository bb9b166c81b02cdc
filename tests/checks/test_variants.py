"""Only what a template reads is varied, at the values it compares against."""

from __future__ import annotations

from checks.rendering import CheckEnvironment
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
