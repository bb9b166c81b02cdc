"""The agent sessions the engine replays: named, stable, reused by the probe and the pages.

A session is a full message list; its requests are the prefixes that end on a user or tool message
followed by an assistant reply (or by nothing). Each request is rendered with the generation prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

SYSTEM_PROMPT = "You are a careful assistant for a travel agency. Answer briefly."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "find_hotels",
            "description": "Find hotels in a city for a number of nights",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "nights": {"type": "integer", "description": "How many nights"},
                },
                "required": ["city", "nights"],
            },
        },
    },
]


@dataclass(frozen=True)
class Session:
    """A named conversation an agent could have with a model."""

    name: str
    title: str
    messages: tuple[Message, ...]
    uses_tools: bool

    def requests(self) -> list[tuple[Message, ...]]:
        """The message lists an agent sends, in order (each ends on a user or tool message)."""
        return [self.messages[:end] for end in self.request_ends()]

    def replies(self) -> list[Message]:
        """The assistant message that follows each request but the last."""
        return [self.messages[end] for end in self.request_ends()[:-1]]

    def request_ends(self) -> list[int]:
        """Index (exclusive) of the end of each request."""
        return request_ends(self.messages)


def request_ends(messages: Sequence[Message]) -> list[int]:
    """Where a client's requests end in a session: after each user or tool message that an
    assistant reply (or nothing) follows. The one rule for the engine and the Mac probe."""
    ends = []
    for i, message in enumerate(messages):
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        if message["role"] in ("user", "tool") and (nxt is None or nxt["role"] == "assistant"):
            ends.append(i + 1)
    return ends


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _system() -> Message:
    return {"role": "system", "content": SYSTEM_PROMPT}


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _assistant(text: str, **extra: Any) -> Message:
    return {"role": "assistant", "content": text, **extra}


def _tool(call_id: str, name: str, result: dict[str, Any]) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": json.dumps(result)}


U1 = "What's the weather in Paris today?"
U2 = "Thanks. And is it a good day for a walk by the river?"
U3 = "Great, please book me a hotel for two nights."
A1 = "It is sunny in Paris, 21 degrees."
A2 = "Yes, a walk along the Seine would be lovely this afternoon."
R1 = "The user asks about Paris weather. I should answer from what I know."
R2 = "A walk depends on the weather, which is sunny, so I say yes."
CALL_WEATHER = _call("call00001", "get_weather", {"city": "Paris", "unit": "celsius"})
CALL_WEATHER_LYON = _call("call00002", "get_weather", {"city": "Lyon", "unit": "celsius"})
CALL_HOTELS = _call("call00003", "find_hotels", {"city": "Paris", "nights": 2})
WEATHER_RESULT = {"temperature": 21, "sky": "sunny"}
LYON_RESULT = {"temperature": 18, "sky": "cloudy"}
HOTELS_RESULT = {"hotels": ["Hotel du Nord", "Le Petit Louvre"]}


def _build() -> tuple[Session, ...]:
    chat = (_system(), _user(U1), _assistant(A1), _user(U2), _assistant(A2), _user(U3))
    tool_round = (
        _system(),
        _user(U1),
        _assistant("", tool_calls=[CALL_WEATHER]),
        _tool("call00001", "get_weather", WEATHER_RESULT),
        _assistant(A1),
        _user(U2),
    )
    return (
        Session("chat", "Multi-turn chat with a system prompt", chat, False),
        Session("chat_no_system", "Multi-turn chat without a system prompt", chat[1:], False),
        Session("chat_with_tools", "Multi-turn chat with tools defined, none called", chat, True),
        Session(
            "tool_round",
            "A tool call, its result, the answer, the next user turn",
            tool_round,
            True,
        ),
        Session(
            "parallel_tool_calls",
            "Two tool calls in one turn, both results, the answer, the next user turn",
            (
                _system(),
                _user("Compare the weather in Paris and Lyon."),
                _assistant("", tool_calls=[CALL_WEATHER, CALL_WEATHER_LYON]),
                _tool("call00001", "get_weather", WEATHER_RESULT),
                _tool("call00002", "get_weather", LYON_RESULT),
                _assistant("Paris is sunny at 21 degrees, Lyon cloudy at 18."),
                _user(U2),
            ),
            True,
        ),
        Session(
            "tool_rounds",
            "Two tool rounds in a row before the answer, then the next user turn",
            (
                _system(),
                _user("Weather in Paris, then hotels for two nights there."),
                _assistant("", tool_calls=[CALL_WEATHER]),
                _tool("call00001", "get_weather", WEATHER_RESULT),
                _assistant("", tool_calls=[CALL_HOTELS]),
                _tool("call00003", "find_hotels", HOTELS_RESULT),
                _assistant("Sunny, 21 degrees. Hotel du Nord and Le Petit Louvre are free."),
                _user(U3),
            ),
            True,
        ),
        Session(
            "reasoning_history",
            "Multi-turn chat whose assistant turns carry reasoning_content",
            (
                _system(),
                _user(U1),
                _assistant(A1, reasoning_content=R1),
                _user(U2),
                _assistant(A2, reasoning_content=R2),
                _user(U3),
            ),
            False,
        ),
        Session(
            "reasoning_tool_round",
            "Reasoning before a tool call and before the answer, then the next user turn",
            (
                _system(),
                _user(U1),
                _assistant(
                    "", reasoning_content="I need the weather tool.", tool_calls=[CALL_WEATHER]
                ),
                _tool("call00001", "get_weather", WEATHER_RESULT),
                _assistant(A1, reasoning_content="The tool says sunny, 21 degrees."),
                _user(U2),
            ),
            True,
        ),
        Session(
            "padded_content",
            "Assistant replies with leading and trailing whitespace",
            (
                _system(),
                _user(U1),
                _assistant("\n\n" + A1 + "  \n"),
                _user(U2),
                _assistant(" " + A2 + "\n"),
                _user(U3),
            ),
            False,
        ),
    )


SESSIONS: tuple[Session, ...] = _build()
SESSION_NAMES: tuple[str, ...] = tuple(session.name for session in SESSIONS)


def session_named(name: str) -> Session:
    for session in SESSIONS:
        if session.name == name:
            return session
    raise KeyError(name)


def with_string_arguments(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """The same messages with tool-call arguments as JSON strings (the OpenAI wire form)."""
    converted = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {
                **message,
                "tool_calls": [
                    {
                        **call,
                        "function": {
                            **call["function"],
                            "arguments": json.dumps(call["function"]["arguments"]),
                        },
                    }
                    for call in calls
                ],
            }
        converted.append(message)
    return tuple(converted)


FORCED_REASONING = "Let me work out the answer before replying."


def with_reasoning(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """The same messages with reasoning on every assistant reply that has none."""
    return tuple(
        {**m, "reasoning_content": FORCED_REASONING}
        if m["role"] == "assistant" and not m.get("reasoning_content")
        else m
        for m in messages
    )


def without_reasoning(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """The same messages with no reasoning: what a model with thinking switched off emits."""
    return tuple({k: v for k, v in m.items() if k != "reasoning_content"} for m in messages)
