"""Request sequences written for each cause a diagnosis can find (CLI, API, page and proxy tests).

Each case is (name, template, bodies, the pair to look at (1-based `from`), expected cause).
"""

from __future__ import annotations

import copy
from typing import Any

# Writes tools, then every message with the reasoning it is sent: a client's change shows.
PLAIN = (
    "{%- if tools %}<tools>{{ tools | tojson }}</tools>{% endif -%}\n"
    "{%- for m in messages -%}\n"
    "<{{ m.role }}>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
    "{% endif %}{{ m.content }}</s>\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}<assistant>{% endif -%}\n"
)
# Line 3 marks the newest user message: the marker moves on every request.
MARKER = (
    "{%- for m in messages -%}\n"
    "{%- if m.role == 'user' and loop.last %}[NEWEST]{% endif -%}\n"
    "<{{ m.role }}>{{ m.content }}</s>\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}<assistant>{% endif -%}\n"
)

SYSTEM = "You are a coding agent. x-billing-header: cc_version=2.1; cch=a1b2c;"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    },
]


def conversation(turns: int = 3) -> list[dict[str, Any]]:
    """Request bodies of a well-behaved client: each request extends the previous one."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "List the files."},
    ]
    bodies = [{"model": "m", "messages": copy.deepcopy(messages), "tools": TOOLS}]
    for k in range(1, turns):
        messages += [
            {
                "role": "assistant",
                "content": f"Answer {k}.",
                "reasoning_content": f"I think about step {k}.",
            },
            {"role": "user", "content": f"Next question {k}."},
        ]
        bodies.append({"model": "m", "messages": copy.deepcopy(messages), "tools": TOOLS})
    return bodies


def _system_nonce() -> list[dict[str, Any]]:
    bodies = conversation()
    bodies[1]["messages"][0]["content"] = SYSTEM.replace("a1b2c", "f9e8d")
    return bodies


def _tools_reordered() -> list[dict[str, Any]]:
    bodies = conversation()
    bodies[1]["tools"] = list(reversed(TOOLS))
    return bodies


def _history_edited() -> list[dict[str, Any]]:
    bodies = conversation()
    bodies[2]["messages"][1]["content"] = "List the files, please."
    return bodies


def _reasoning_dropped() -> list[dict[str, Any]]:
    bodies = conversation()
    del bodies[2]["messages"][2]["reasoning_content"]
    return bodies


def _truncated() -> list[dict[str, Any]]:
    bodies = conversation()
    # Context trimming: the first exchange is gone from request 3.
    del bodies[2]["messages"][1:3]
    return bodies


def _client_and_template() -> list[dict[str, Any]]:
    # The template's marker moves off user 2 (before its text); the client also edited that
    # user message's text, further on.
    bodies = conversation()
    bodies[2]["messages"][3]["content"] = "Next question 1, edited."
    return bodies


def _anthropic() -> list[dict[str, Any]]:
    first: dict[str, Any] = {
        "model": "m",
        "system": [{"type": "text", "text": SYSTEM}],
        "tools": [
            {"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}
        ],
        "messages": [{"role": "user", "content": "Read a.txt"}],
    }
    second = copy.deepcopy(first)
    second["system"] = [{"type": "text", "text": SYSTEM.replace("a1b2c", "77777")}]
    second["messages"] += [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                {"type": "tool_use", "id": "tu1", "name": "read_file", "input": {"path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "hello"}],
        },
    ]
    return [first, second]


CASES: list[tuple[str, str, list[dict[str, Any]], int, str]] = [
    ("none", PLAIN, conversation(), 1, "none"),
    ("system_changed", PLAIN, _system_nonce(), 1, "system_changed"),
    ("tools_changed", PLAIN, _tools_reordered(), 1, "tools_changed"),
    ("history_edited", PLAIN, _history_edited(), 2, "history_edited"),
    ("reasoning_dropped", PLAIN, _reasoning_dropped(), 2, "reasoning_dropped"),
    ("history_truncated", PLAIN, _truncated(), 2, "history_truncated"),
    ("template", MARKER, conversation(), 1, "template"),
    ("template_before_client", MARKER, _client_and_template(), 2, "template"),
    ("client_before_template", MARKER, _system_nonce(), 1, "system_changed"),
    ("anthropic_system", PLAIN, _anthropic(), 1, "system_changed"),
]
