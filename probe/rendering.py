"""Requests to tokens exactly as `mlx_lm.server` renders them, and the replies between them."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

Message = dict[str, Any]


@dataclass(frozen=True)
class ChatRequest:
    """One request of a conversation: OpenAI-style messages ending on a user or tool message."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


@dataclass
class RenderedPrompt:
    """A request's prompt tokens and the server's segments (system / user / thinking tail)."""

    tokens: list[int]
    segments: list[list[int]] = field(default_factory=list)
    segment_types: list[str] = field(default_factory=list)


def parse_request(raw: Any) -> ChatRequest:
    """Accept a list of messages, or {"messages": [...], "tools": [...]}."""
    if isinstance(raw, dict):
        messages, tools = raw.get("messages"), raw.get("tools")
    else:
        messages, tools = raw, None
    if not isinstance(messages, list) or not messages:
        raise ValueError("a request must be a non-empty list of messages")
    if not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError("every message must be a dict with a role")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools must be a list")
    return ChatRequest(list(messages), list(tools) if tools else None)


def render_prompt(
    tokenizer: Any, request: ChatRequest, template_kwargs: dict[str, Any] | None = None
) -> RenderedPrompt:
    """Tokenize like the server: its own `_tokenize`, so segments and checkpoints match."""
    from mlx_lm.server import CompletionRequest, ResponseGenerator

    # `_tokenize` only reads these attributes of the generator and of the request arguments.
    fake_self = SimpleNamespace(
        model_provider=SimpleNamespace(
            processor=None, cli_args=SimpleNamespace(chat_template_args={})
        )
    )
    args = SimpleNamespace(chat_template_kwargs=template_kwargs or None)
    completion = CompletionRequest(
        "chat", "", copy.deepcopy(request.messages), copy.deepcopy(request.tools), None
    )
    tokenize: Any = ResponseGenerator._tokenize
    prompt, segments, types, _, _ = tokenize(fake_self, tokenizer, completion, args)
    return RenderedPrompt(list(prompt), [list(s) for s in segments], list(types))


def render_tokens(
    tokenizer: Any,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Render and tokenize with the server's message normalization, without its segmenting."""
    from mlx_lm.server import process_message_content

    messages = copy.deepcopy(messages)
    process_message_content(messages, keep_images=False)
    out = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        tools=copy.deepcopy(tools),
        tokenize=True,
        **(template_kwargs or {}),
    )
    return [int(t) for t in out]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common token prefix."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def forced_reply(
    tokenizer: Any,
    current: ChatRequest,
    following: ChatRequest,
    prompt: list[int],
    template_kwargs: dict[str, Any] | None = None,
) -> list[int] | None:
    """The tokens a model trained on this template emits as its reply to `current`.

    That is the assistant message `following` carries, written as the template writes it when
    it is the last message, after `prompt`, up to and including the first end-of-turn token.
    None when `following` does not extend `current` with an assistant message.
    """
    n = len(current.messages)
    if following.messages[:n] != current.messages or len(following.messages) <= n:
        return None
    reply = following.messages[n]
    if reply.get("role") != "assistant":
        return None
    turn = render_tokens(
        tokenizer,
        current.messages + [reply],
        following.tools if following.tools is not None else current.tools,
        add_generation_prompt=False,
        template_kwargs=template_kwargs,
    )
    # Where the template's generation prompt and its own writing of the turn part, the model
    # takes over: anything the generation prompt wrote is already in the cache.
    emitted = turn[common_prefix(prompt, turn) :]
    eos = set(tokenizer.eos_token_ids)
    for i, tok in enumerate(emitted):
        if tok in eos:
            return emitted[: i + 1]
    end = min(eos) if eos else None
    return emitted + ([end] if end is not None else [])
