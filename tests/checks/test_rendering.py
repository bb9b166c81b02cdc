"""Our renderer equals transformers' own, byte for byte, on every render the engine asks for."""

from __future__ import annotations

import inspect
import json
from datetime import datetime
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils import chat_template_utils

from checks.attribution import render_with_spans
from checks.conversations import SESSIONS, TOOLS
from checks.engine import RenderCall, Renderer, run_check
from checks.options import DEFAULT_NOW, CheckOptions
from checks.rendering import (
    CheckEnvironment,
    TemplateCache,
    normalize_messages,
    render,
    template_context,
)
from checks.sources import TemplateSource
from checks.variants import Variant
from tests.checks.conftest import corpus_cases, corpus_source


class PinnedDatetime(datetime):
    """transformers' strftime_now reads `datetime.now()`; pin it to the engine's clock."""

    @classmethod
    def now(cls, tz: Any = None) -> PinnedDatetime:
        return cls.fromtimestamp(DEFAULT_NOW.timestamp(), tz)


@pytest.fixture(autouse=True)
def pinned_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template_utils, "datetime", PinnedDatetime)


def transformers_render(source: TemplateSource, call: RenderCall) -> str:
    """What `tokenizer.apply_chat_template(..., tokenize=False)` returns in transformers 5.x."""
    # apply_chat_template drops None-valued keys, then merges special tokens under the kwargs.
    messages = [{k: v for k, v in m.items() if v is not None} for m in call.messages]
    rendered, _ = chat_template_utils.render_jinja_template(  # type: ignore[str-unpack]
        conversations=[messages],
        tools=None if call.tools is None else list(call.tools),
        chat_template=source.templates[call.template_name],
        add_generation_prompt=call.add_generation_prompt,
        **{**source.special_tokens, **dict(call.kwargs)},
    )
    return str(rendered[0])


def ours(templates: TemplateCache, source: TemplateSource, call: RenderCall) -> str:
    return render(
        templates.get(source.sha256 + call.template_name, source.templates[call.template_name]),
        call.context(source.special_tokens),
    )


def outcome(function: Any, *args: Any) -> tuple[str, str]:
    try:
        return "ok", function(*args)
    except Exception as exc:  # noqa: BLE001 - both sides raising is agreement
        return "raised", type(exc).__name__


def test_transformers_signature_is_the_one_we_mirror() -> None:
    parameters = inspect.signature(chat_template_utils.render_jinja_template).parameters
    assert list(parameters)[:7] == [
        "conversations",
        "tools",
        "documents",
        "chat_template",
        "return_assistant_tokens_mask",
        "continue_final_message",
        "add_generation_prompt",
    ]
    assert inspect.Parameter.VAR_KEYWORD in {p.kind for p in parameters.values()}


@pytest.mark.parametrize("entry", corpus_cases())
def test_every_engine_render_matches_transformers(entry: dict[str, Any]) -> None:
    source = corpus_source(entry)
    calls: list[RenderCall] = []
    templates = TemplateCache(CheckEnvironment())
    run_check(source, templates, options=CheckOptions(), observer=calls.append)
    assert calls, "the engine rendered nothing"
    mismatches = []
    for call in calls:
        theirs = outcome(transformers_render, source, call)
        mine = outcome(ours, templates, source, call)
        if theirs[0] != mine[0] or (theirs[0] == "ok" and theirs[1] != mine[1]):
            mismatches.append((call.template_name, call.kwargs, len(call.messages), theirs, mine))
    assert not mismatches, mismatches[:3]


def test_renderer_memoizes_identical_requests() -> None:
    source = TemplateSource({"default": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    calls: list[RenderCall] = []
    renderer = Renderer(source, TemplateCache(CheckEnvironment()), CheckOptions(), calls.append)
    variant = Variant("default", ())
    messages = ({"role": "user", "content": "hi"},)
    assert renderer.render(variant, messages, None, True) == "hi"
    assert renderer.render(variant, messages, None, True) == "hi"
    assert len(calls) == 1


def test_tojson_keeps_key_order_and_does_not_html_escape() -> None:
    template = CheckEnvironment().from_string("{{ tools | tojson }}")
    tools = [{"z": "<b>&'", "a": 1}]
    assert template.render(tools=tools) == '[{"z": "<b>&\'", "a": 1}]'


def test_tojson_of_a_frozen_value_is_written_once_per_argument_set() -> None:
    environment = CheckEnvironment()
    tools = [{"z": "<b>", "a": [1, 2]}]
    environment.freeze(tools)
    template = environment.from_string(
        "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ tools[0].a | tojson }}"
    )
    expected = '[{"z": "<b>", "a": [1, 2]}]|' + json.dumps(tools[0], indent=2) + "|[1, 2]"
    assert template.render(tools=tools) == expected
    assert template.render(tools=tools) == expected  # from the frozen values' cache
    other = [{"z": "<i>", "a": [3]}]  # not frozen: written afresh
    assert template.render(tools=other) == (
        '[{"z": "<i>", "a": [3]}]|' + json.dumps(other[0], indent=2) + "|[3]"
    )


@pytest.mark.parametrize(
    "expression",
    [
        "m.role",
        "m.missing is defined",
        "m['role']",
        "m.items() | list | length",  # a dict attribute wins over a key of that name
        "m.keys is defined",
        "m.__class__ is defined",  # refused by the sandbox, as before
        "m.get('role')",
        "(m.content or '').upper()",
    ],
)
def test_attribute_reads_on_dicts_answer_as_jinjas_sandbox_does(expression: str) -> None:
    message = {"role": "user", "content": "hi", "items": "shadowed", "keys": 3}
    text = "{{ " + expression + " }}"
    theirs = ImmutableSandboxedEnvironment().from_string(text).render(m=message)
    assert CheckEnvironment().from_string(text).render(m=message) == theirs


def test_strftime_now_uses_the_pinned_clock() -> None:
    environment = CheckEnvironment(now=datetime(2024, 2, 29, 8, 0))
    assert environment.from_string("{{ strftime_now('%d %b %Y') }}").render() == "29 Feb 2024"


@pytest.mark.parametrize("entry", corpus_cases(step=5))
def test_attribution_does_not_change_the_render(entry: dict[str, Any]) -> None:
    source = corpus_source(entry)
    templates = TemplateCache(CheckEnvironment())
    session = SESSIONS[3]  # tool_round: system, tools, a call, a result
    messages = list(session.messages[: session.request_ends()[-1]])
    context = template_context(
        normalize_messages(messages),
        tools=TOOLS,
        add_generation_prompt=True,
        special_tokens=source.special_tokens,
        kwargs={},
    )
    template = templates.get(source.sha256, source.templates["default"])
    plain = outcome(render, template, context)
    if plain[0] != "ok":
        pytest.skip(f"template refuses the session: {plain[1]}")
    text, spans = render_with_spans(template, context, 1 << 22)
    assert text == plain[1]
    assert [s.start for s in spans[1:]] == [s.end for s in spans[:-1]]
    assert all(s.line > 0 for s in spans)


def test_generation_tag_and_loop_controls_render_like_transformers() -> None:
    text = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    )
    source = TemplateSource({"default": text})
    call = RenderCall(
        "default", tuple({"role": "user", "content": c} for c in "abc"), None, True, ()
    )
    assert ours(TemplateCache(CheckEnvironment()), source, call) == "[a][b]"
    assert transformers_render(source, call) == "[a][b]"
