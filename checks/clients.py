"""Client profiles: the ways real clients send a conversation's history back (docs/engine.md).

The model emits the same reply whatever the client; what differs is what the client puts in the
next request. A profile turns the messages the model produced into the messages the client sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

# How reasoning goes back.
REASONING_DROPPED = "dropped"
REASONING_FIELD = "reasoning_content"
REASONING_CHUNKS = "chunks"
# How tool-call arguments reach the template.
ARGUMENTS_AUTO = "auto"  # objects, or JSON strings where the template refuses objects
ARGUMENTS_OBJECTS = "dict"
ARGUMENTS_STRINGS = "string"


@dataclass(frozen=True)
class ClientProfile:
    name: str
    label: str
    reasoning: str
    arguments: str

    def history(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """What this client sends back for messages the model emitted (reasoning included)."""
        if self.reasoning == REASONING_FIELD:
            return messages
        if self.reasoning == REASONING_DROPPED:
            return tuple(_without_reasoning(m) for m in messages)
        return tuple(_as_chunks(m) for m in messages)

    def argument_forms(self, has_calls: bool) -> tuple[str, ...]:
        if not has_calls:
            return ("none",)
        if self.arguments == ARGUMENTS_AUTO:
            return (ARGUMENTS_OBJECTS, ARGUMENTS_STRINGS)
        return (self.arguments,)


def _without_reasoning(message: Message) -> Message:
    if message.get("role") != "assistant" or "reasoning_content" not in message:
        return message
    return {k: v for k, v in message.items() if k != "reasoning_content"}


def _as_chunks(message: Message) -> Message:
    """Mistral-style content chunks: `[{"type": "thinking", …}, {"type": "text", …}]`."""
    reasoning = message.get("reasoning_content")
    if message.get("role") != "assistant" or not reasoning:
        return message
    chunks: list[dict[str, Any]] = [{"type": "thinking", "thinking": reasoning}]
    if message.get("content"):
        chunks.append({"type": "text", "text": message["content"]})
    return {**_without_reasoning(message), "content": chunks}


#: The client most readers have: an OpenAI-compatible client keeps `content` and `tool_calls` and
#: drops the reasoning the server returned (the Chat Completions API has no field for it), and the
#: server passes tool-call arguments on in the form the template accepts.
TYPICAL = ClientProfile(
    "typical",
    "drops reasoning, sends tool arguments as the template accepts them "
    "(most OpenAI-compatible clients)",
    REASONING_DROPPED,
    ARGUMENTS_AUTO,
)
REASONING_SENT = ClientProfile(
    "reasoning_content",
    "sends reasoning back as reasoning_content",
    REASONING_FIELD,
    ARGUMENTS_AUTO,
)
THINKING_CHUNKS = ClientProfile(
    "thinking_chunks",
    'sends reasoning back as {"type": "thinking"} content chunks (Mistral style)',
    REASONING_CHUNKS,
    ARGUMENTS_AUTO,
)
OBJECT_ARGUMENTS = ClientProfile(
    "arguments_objects",
    "sends tool-call arguments as objects (what vLLM and SGLang pass after parsing)",
    REASONING_DROPPED,
    ARGUMENTS_OBJECTS,
)
STRING_ARGUMENTS = ClientProfile(
    "arguments_strings",
    "sends tool-call arguments as JSON strings (the OpenAI wire form, passed through)",
    REASONING_DROPPED,
    ARGUMENTS_STRINGS,
)
PROFILES: tuple[ClientProfile, ...] = (
    TYPICAL,
    REASONING_SENT,
    THINKING_CHUNKS,
    OBJECT_ARGUMENTS,
    STRING_ARGUMENTS,
)
PROFILE_NAMES = tuple(p.name for p in PROFILES)


def profile_named(name: str) -> ClientProfile:
    for profile in PROFILES:
        if profile.name == name:
            return profile
    raise KeyError(name)
