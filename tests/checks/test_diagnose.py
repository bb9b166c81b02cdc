"""`python -m checks diagnose` and the library under it: each cause, found in requests written
for it, the earlier of a client's and a template's change, and bad input."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers.tokenization_utils_base import PreTrainedTokenizerBase
from transformers.utils import chat_template_utils

from checks import (
    RequestError,
    SandboxPool,
    TemplateSource,
    diagnose_requests,
    parse_text,
)
from checks.diagnose import client_change
from checks.sandbox import SandboxError
from tests.checks.test_cli import run
from tests.diagnose_cases import CASES, MARKER, PLAIN, TOOLS, conversation


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    pool = SandboxPool(size=1)
    yield pool
    pool.close()


def write_case(tmp_path: Path, template: str, bodies: list[dict[str, Any]]) -> tuple[Path, Path]:
    template_path = tmp_path / "chat_template.jinja"
    template_path.write_text(template)
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    return template_path, log


@pytest.mark.parametrize(
    ("name", "template", "bodies", "pair", "cause"), CASES, ids=[c[0] for c in CASES]
)
def test_each_cause_from_the_cli(
    tmp_path: Path, name: str, template: str, bodies: list[dict[str, Any]], pair: int, cause: str
) -> None:
    template_path, log = write_case(tmp_path, template, bodies)
    process = run("diagnose", str(log), "--template", str(template_path), "--json")
    assert process.returncode == 0, process.stderr
    pairs = json.loads(process.stdout)["pairs"]
    assert [(p["from"], p["to"]) for p in pairs] == [(k, k + 1) for k in range(1, len(bodies))]
    found = pairs[pair - 1]
    assert found["cause"] == cause, found
    if cause == "none":
        assert found["prompt_reuse"] > 0.5 and found["hint"] == ""
    else:
        assert found["hint"] and found["prompt_reuse"] < 1.0


def test_where_says_message_field_and_offset_with_whitespace_visible(pool: SandboxPool) -> None:
    (_, _, bodies, _, _) = next(c for c in CASES if c[0] == "system_changed")
    requests = parse_text("\n".join(json.dumps(b) for b in bodies), "log")
    (first, _) = diagnose_requests(TemplateSource({"default": PLAIN}), requests, pool=pool)
    where = first["where"]
    assert (where["message"], where["field"]) == (1, "content")
    assert where["offset"] == len("You are a coding agent. x-billing-header: cc_version=2.1; cch=")
    assert "cch=a1b2c;" in where["before"] and "cch=f9e8d;" in where["after"]
    assert "·" in where["before"]  # spaces made visible
    assert "move what varies" in first["hint"]


def test_the_template_cause_names_its_line(pool: SandboxPool) -> None:
    requests = parse_text(json.dumps(conversation(2)), "log")
    (pair,) = diagnose_requests(TemplateSource({"default": MARKER}), requests, pool=pool)
    assert pair["cause"] == "template"
    assert pair["where"]["template_line"] == 2
    assert "[NEWEST]" in pair["where"]["before"]


def test_the_table_for_a_reader(tmp_path: Path) -> None:
    (_, template, bodies, _, _) = next(c for c in CASES if c[0] == "tools_changed")
    template_path, log = write_case(tmp_path, template, bodies)
    process = run("diagnose", str(log), "--template", str(template_path))
    assert process.returncode == 0, process.stderr
    assert "1 → 2" in process.stdout and "tools_changed" in process.stdout
    assert "the same tools in another order (read_file, run → run, read_file)" in process.stdout
    assert "in a fixed order (sort them" in process.stdout
    (_, template, bodies, _, _) = next(c for c in CASES if c[0] == "system_changed")
    template_path, log = write_case(tmp_path, template, bodies)
    table = run("diagnose", str(log), "--template", str(template_path)).stdout
    prefix = "You are a coding agent. x-billing-header: cc_version=2.1; cch="
    assert f"message 1, content, character {len(prefix) + 1}\n" in table  # from 1, as messages


#: Adds each message's content to a string, as Qwen3's template does: a missing content fails.
CONCAT = (
    "{%- for m in messages -%}{{ '<' + m.role + '>' + m.content + '</s>' }}{%- endfor -%}"
    "{%- if add_generation_prompt %}<assistant>{% endif -%}"
)
TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def test_an_openai_tool_call_turn_renders_as_the_server_renders_it(pool: SandboxPool) -> None:
    """An assistant turn that only calls tools comes with `"content": null`, and a client may
    send text as a list of parts: the servers give the template "" and the joined text."""
    asked = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "weather in "},
                {"type": "text", "text": "Paris?"},
            ],
        }
    ]
    called = [*asked, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}]
    answered = [*called, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    requests = parse_text("\n".join(json.dumps({"messages": m}) for m in (asked, answered)), "log")
    assert requests[0].messages[0]["content"] == "weather in Paris?"
    assert requests[1].messages[1]["content"] == ""
    (pair,) = diagnose_requests(TemplateSource({"default": CONCAT}), requests, pool=pool)
    assert pair["cause"] == "none", pair
    assert pair["prompt_reuse"] > 0.5


def test_a_message_removed_before_a_new_one_is_truncation_not_an_edit() -> None:
    """Request 2 drops the first user message and starts with the reply to it, which request
    1 never had: the user message was removed, not sent with another role."""
    system = {"role": "system", "content": "You are an agent."}
    hi = {"role": "user", "content": "hi"}
    first = {"messages": [system, hi]}
    second = {
        "messages": [
            system,
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]
    }
    old, new = parse_text(json.dumps([first, second]), "log")
    change = client_change(old, new)
    assert change is not None and change.cause == "history_truncated", change
    assert change.detail == "user message 2 was removed from request k+1"
    # The same role with other words is still an edit.
    edited = {
        "messages": [system, {"role": "user", "content": "HI"}, {"role": "user", "content": "more"}]
    }
    old, new = parse_text(json.dumps([first, edited]), "log")
    assert (change := client_change(old, new)) is not None and change.cause == "history_edited"


#: GLM style: reads each argument of a call as an object's items (a string has none).
ITEMS = (
    "{%- for m in messages -%}<{{ m.role }}>{{ m.content }}"
    "{%- for call in m.tool_calls or [] %}[{{ call.function.name }}"
    "{%- for key, value in call.function.arguments.items() %} {{ key }}={{ value }}{% endfor %}]"
    "{%- endfor %}</s>{%- endfor -%}{%- if add_generation_prompt %}<assistant>{% endif -%}"
)
#: DeepSeek R1 style: adds the arguments to a string (an object raises).
CONCATENATED = (
    "{%- for m in messages -%}<{{ m.role }}>{{ m.content }}"
    "{%- for call in m.tool_calls or [] %}"
    "[{{ call.function.name + ' ' + call.function.arguments }}]"
    "{%- endfor %}</s>{%- endfor -%}{%- if add_generation_prompt %}<assistant>{% endif -%}"
)


@pytest.mark.parametrize("template", [ITEMS, CONCATENATED], ids=["objects", "strings"])
def test_tool_arguments_reach_the_template_as_the_server_passes_them(
    pool: SandboxPool, template: str
) -> None:
    """OpenAI clients send arguments as JSON strings; the servers parse them into objects
    before the template sees them, and a template that refuses objects gets the strings."""
    asked = [{"role": "user", "content": "weather in Paris?"}]
    called = [*asked, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}]
    answered = [*called, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    bodies = [{"messages": asked}, {"messages": answered}]
    requests = parse_text("\n".join(json.dumps(b) for b in bodies), "log")
    (pair,) = diagnose_requests(TemplateSource({"default": template}), requests, pool=pool)
    assert pair["cause"] == "none", pair


def test_a_template_that_fails_names_the_request(pool: SandboxPool) -> None:
    failing = (
        "{%- for m in messages -%}{{ m.content }}"
        "{% if m.role == 'tool' %}{{ 1 + m.content }}{% endif %}{%- endfor -%}"
    )
    first = {"messages": [{"role": "user", "content": "hi"}]}
    second = {
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "content": "sunny"},
        ]
    }
    requests = parse_text(json.dumps([first, second]), "log")
    with pytest.raises(SandboxError, match=r"^request 2: TypeError: unsupported operand"):
        diagnose_requests(TemplateSource({"default": failing}), requests, pool=pool)


def test_named_templates_without_a_default_render_only_what_transformers_picks(
    pool: SandboxPool,
) -> None:
    """No `default`: transformers renders requests that pass tools with `tool_use`, and raises
    for the others unless the caller names a template; diagnosing takes no template in its
    place."""
    source = TemplateSource({"tool_use": MARKER, "rag": PLAIN})
    first = {"messages": [{"role": "user", "content": "hi"}]}
    turn = [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    second = {"messages": [*first["messages"], *turn]}
    bodies = [{**first, "tools": [TOOLS[0]]}, {**second, "tools": [TOOLS[0]]}]
    with_tools = diagnose_requests(source, parse_text(json.dumps(bodies), "log"), pool=pool)
    assert [p["cause"] for p in with_tools] == ["template"]  # `tool_use`'s marker moved
    without = parse_text(json.dumps([first, second]), "log")
    with pytest.raises(
        SandboxError,
        match=r"^request 1: ValueError: This model has multiple chat templates with no default "
        r"specified! .* Available template names are \['rag', 'tool_use'\]\.$",
    ):
        diagnose_requests(source, without, pool=pool)


FIRST: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
SECOND: dict[str, Any] = {
    "messages": [
        *FIRST["messages"],
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
    ]
}


# Writes the tools it is given, an empty list too: none is not written.
LISTED = "{%- if tools is not none %}<tools>{{ tools | tojson }}</tools>{% endif %}" + PLAIN


def transformers_prompt(templates: dict[str, str], body: dict[str, Any]) -> str:
    """What `apply_chat_template(messages, tools=body's tools, tokenize=False,
    add_generation_prompt=True)` returns: the template transformers picks, then its render."""
    tools = body.get("tools")
    tokenizer = SimpleNamespace(chat_template=dict(templates))
    text = PreTrainedTokenizerBase.get_chat_template(tokenizer, None, tools)  # type: ignore[arg-type]
    rendered, _ = chat_template_utils.render_jinja_template(  # type: ignore[str-unpack]
        conversations=[body["messages"]],
        tools=tools,
        chat_template=text,
        add_generation_prompt=True,
    )
    return str(rendered[0])


def test_an_empty_tools_list_is_tools_passed_as_transformers_passes_it(pool: SandboxPool) -> None:
    """`"tools": []` passes tools (vLLM hands the request's list on): transformers takes
    `tool_use` for it, and the template sees [] where it sees none without the key. Each pair's
    renders are transformers' own, byte for byte."""
    causes = []
    for templates in ({"default": LISTED}, {"default": LISTED, "tool_use": MARKER}):
        sent: dict[str, list[Any]]
        for sent in ({}, {"tools": []}):
            bodies = [{**FIRST, **sent}, {**SECOND, **sent}]
            requests = parse_text(json.dumps(bodies), "log")
            (pair,) = diagnose_requests(TemplateSource(templates), requests, pool=pool)
            before, after = (transformers_prompt(templates, body) for body in bodies)
            shared = len(os.path.commonprefix([before, after]).encode())
            assert (pair["reused"], pair["next_size"]) == (shared, len(after.encode()))
            causes.append(pair["cause"])
    # `tool_use`'s marker moves: only the empty list with a `tool_use` template breaks.
    assert causes == ["none", "none", "none", "template"]


def test_an_empty_tools_list_sent_or_dropped_is_the_clients_change(pool: SandboxPool) -> None:
    """No "tools", then "tools": [] (or back): the template is given another `tools` (and with
    a `tool_use` template, transformers takes that one): the client's change, not the
    template's."""
    source = TemplateSource({"default": LISTED})
    for sent, said in [
        (
            [FIRST, {**SECOND, "tools": []}],
            'an empty "tools" list was sent, where request k sent none',
        ),
        ([{**FIRST, "tools": []}, SECOND], 'the empty "tools" list was not sent again'),
    ]:
        (pair,) = diagnose_requests(source, parse_text(json.dumps(sent), "log"), pool=pool)
        assert (pair["cause"], pair["detail"]) == ("tools_changed", said)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "line 1: not valid JSON"),
        ('{"messages": []}', 'needs a non-empty "messages" list'),
        ("[1, 2]", "must be a JSON object"),
        ('{"messages": [{"content": "no role"}]}', "message 1 must be an object with a role"),
        ('{"messages": [{"role": "user", "content": "x"}], "tools": {}}', '"tools" must be a list'),
        # A tool of the wrong shape was blamed on the template ("the template failed").
        ('{"messages": [{"role": "user", "content": "x"}], "tools": [5]}', "tools item 1 must be"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": 5}]}',
            'tools item 1: "function" must be an object',
        ),
        # Parsed, but too deep for JSON's encoder to write again for the sandbox.
        (
            '{"messages": [{"role": "user", "content": "x", "x": ' + "[" * 900 + "]" * 900 + "}]}",
            "nested more than 100 levels deep",
        ),
    ],
)
def test_bad_requests_are_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_text(text, "log")


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    template_path, log = write_case(tmp_path, PLAIN, conversation()[:1])
    one = run("diagnose", str(log), "--template", str(template_path))
    assert one.returncode == 2 and "at least two requests" in one.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [}\n')
    broken = run("diagnose", str(bad), "--template", str(template_path))
    assert broken.returncode == 2 and "bad.jsonl line 1: not valid JSON" in broken.stderr
    hostile = tmp_path / "loop.jinja"
    hostile.write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    _, log2 = write_case(tmp_path, PLAIN, conversation())
    stopped = run("diagnose", str(log2), "--template", str(hostile), "--cpu-seconds", "1")
    assert stopped.returncode == 2 and "CPU budget" in stopped.stderr


def test_tools_sent_again_with_another_key_order_are_the_clients_change(pool: SandboxPool) -> None:
    """docs/diagnose.md: tools_changed covers tools "re-serialized with other key order"."""
    bodies = conversation(2)
    bodies[1]["tools"] = [{"function": t["function"], "type": t["type"]} for t in TOOLS]
    requests = parse_text("\n".join(json.dumps(b) for b in bodies), "log")
    (pair,) = diagnose_requests(TemplateSource({"default": PLAIN}), requests, pool=pool)
    assert pair["cause"] == "tools_changed", pair


#: Writes each tool call's arguments as JSON, as most templates do (`tojson`).
ARGS_JSON = (
    "{%- for m in messages -%}<{{ m.role }}>{{ m.content }}"
    "{%- for call in m.tool_calls or [] %}[{{ call.function.arguments | tojson }}]{%- endfor %}"
    "</s>{%- endfor -%}{%- if add_generation_prompt %}<assistant>{% endif -%}"
)


def test_tool_input_sent_back_with_another_key_order_is_a_history_edit(pool: SandboxPool) -> None:
    first: dict[str, Any] = {
        "system": "S",
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1, "b": 2}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
            },
        ],
    }
    second = copy.deepcopy(first)
    second["messages"][1]["content"][0]["input"] = {"b": 2, "a": 1}  # the client re-serialized it
    second["messages"] += [
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "more"},
    ]
    requests = parse_text(json.dumps([first, second]), "log")
    (pair,) = diagnose_requests(TemplateSource({"default": ARGS_JSON}), requests, pool=pool)
    assert pair["cause"] == "history_edited", pair


def test_chat_template_kwargs_changed_by_the_client_is_not_the_templates_fault(
    pool: SandboxPool,
) -> None:
    template = (
        "{%- if enable_thinking is defined and not enable_thinking %}/no_think{% endif -%}\n"
        + PLAIN
    )
    bodies = conversation(2)
    bodies[0]["chat_template_kwargs"] = {"enable_thinking": True}
    bodies[1]["chat_template_kwargs"] = {"enable_thinking": False}
    requests = parse_text("\n".join(json.dumps(b) for b in bodies), "log")
    (pair,) = diagnose_requests(TemplateSource({"default": template}), requests, pool=pool)
    assert pair["cause"] == "kwargs_changed", pair
    assert pair["where"]["field"] == "chat_template_kwargs.enable_thinking", pair


def test_the_template_causes_byte_offset_counts_bytes(pool: SandboxPool, tmp_path: Path) -> None:
    """The page and the table say "template line N, byte {render_offset}"."""
    bodies = conversation(2)
    for body in bodies:
        body["messages"][0]["content"] = "你好世界" * 10  # 3 bytes a character in UTF-8
    requests = parse_text("\n".join(json.dumps(b) for b in bodies), "log")
    (pair,) = diagnose_requests(TemplateSource({"default": MARKER}), requests, pool=pool)
    assert pair["cause"] == "template"
    # `reused` is the bytes of request 2 before the divergence: the same place.
    assert pair["where"]["render_offset"] == pair["reused"], pair


def test_an_anthropic_body_without_a_system_prompt_has_its_thinking_read(
    pool: SandboxPool,
) -> None:
    """Anthropic thinking blocks become reasoning_content (docs/diagnose.md), also in a body
    that has no "system" and no tool blocks: dropping them is reasoning_dropped."""
    user = {"role": "user", "content": "q1"}
    thought = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "t1", "signature": "sig"},
            {"type": "text", "text": "a1"},
        ],
    }
    first = {
        "model": "claude",
        "max_tokens": 100,
        "messages": [user, thought, {"role": "user", "content": "q2"}],
    }
    second = {
        "model": "claude",
        "max_tokens": 100,
        "messages": [
            user,
            {"role": "assistant", "content": [{"type": "text", "text": "a1"}]},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": [{"type": "text", "text": "a2"}]},
            {"role": "user", "content": "q3"},
        ],
    }
    requests = parse_text(json.dumps([first, second]), "log")
    assert requests[0].messages[1].get("reasoning_content") == "t1", requests[0].messages[1]
    (pair,) = diagnose_requests(TemplateSource({"default": PLAIN}), requests, pool=pool)
    assert pair["cause"] == "reasoning_dropped", pair


def test_a_requests_file_with_a_utf8_bom_is_read(tmp_path: Path) -> None:
    template = tmp_path / "chat_template.jinja"
    template.write_text(PLAIN)
    log = tmp_path / "requests.jsonl"
    text = "".join(json.dumps(b) + "\n" for b in conversation(2))
    log.write_bytes(b"\xef\xbb\xbf" + text.encode())  # as Windows editors and PowerShell save it
    process = run("diagnose", str(log), "--template", str(template), "--json")
    assert process.returncode == 0, process.stderr


def test_a_request_sent_again_with_tools_in_another_key_order_is_not_a_full_hit(
    pool: SandboxPool,
) -> None:
    """The renders differ from byte 10 on; each request must get its own render (the
    renders were memoized by JSON with sorted keys, so request 2 got request 1's)."""
    (first,) = conversation(1)
    again = copy.deepcopy(first)
    again["tools"] = [{"function": t["function"], "type": t["type"]} for t in TOOLS]
    requests = parse_text(json.dumps([first, again]), "log")
    (pair,) = diagnose_requests(TemplateSource({"default": PLAIN}), requests, pool=pool)
    assert pair["cause"] == "tools_changed" and pair["prompt_reuse"] < 0.5, pair
