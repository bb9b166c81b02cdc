"""Why did my cache miss? Diagnose a reader's own requests, pair by pair (docs/diagnose.md).

Each request body (OpenAI chat completions or Anthropic messages) is normalized to the messages a
chat template reads. For request k and k+1 the client's side is compared message by message
(system prompt, tools, earlier messages, reasoning, trimming), and both are rendered with the
generation prompt, in the sandbox (the template is someone else's). The first divergence of the
renders gets one cause: the client's change when it shows up in the render at or before the
divergence, else the template's.

Parsing is pure and runs in the caller; `diagnose_renders` runs in a sandbox worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from checks.attribution import render_with_spans, span_at
from checks.sources import no_default_error, unnamed_choice

NONE = "none"
SYSTEM_CHANGED = "system_changed"
TOOLS_CHANGED = "tools_changed"
HISTORY_EDITED = "history_edited"
REASONING_DROPPED = "reasoning_dropped"
HISTORY_TRUNCATED = "history_truncated"
KWARGS_CHANGED = "kwargs_changed"
TEMPLATE = "template"
DIAGNOSIS_CAUSES = (
    NONE,
    SYSTEM_CHANGED,
    TOOLS_CHANGED,
    HISTORY_EDITED,
    REASONING_DROPPED,
    HISTORY_TRUNCATED,
    KWARGS_CHANGED,
    TEMPLATE,
)
#: Characters of each side shown around a difference.
EXCERPT = 40
#: Request bodies in one diagnosis, and characters per body: beyond that, a clear error.
MAX_REQUESTS = 2000
MAX_BODY_CHARS = 4 * 1024 * 1024
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")

Message = dict[str, Any]


class RequestFailed(Exception):
    """The template failed on one of the reader's requests: the message names which
    (`worded`: the sandbox passes it on as it is, without the class's name)."""

    worded = True


class RequestError(ValueError):
    """A request body we cannot read, said in one sentence."""


@dataclass(frozen=True)
class ClientRequest:
    """One request as a chat template sees it."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    format: str = "openai"

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": list(self.messages),
            "tools": None if self.tools is None else list(self.tools),
            "kwargs": self.kwargs,
            "format": self.format,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClientRequest:
        tools = data.get("tools")
        return cls(
            tuple(data["messages"]),
            None if tools is None else tuple(tools),
            dict(data.get("kwargs") or {}),
            str(data.get("format", "openai")),
        )


def _text(value: Any, where: str) -> str:
    """Anthropic text: a string, or a list of blocks whose text is joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for block in value:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, str):
                parts.append(block)
        return "".join(parts)
    return json.dumps(value, ensure_ascii=False, default=str)  # kept, as text, not refused


def _anthropic_messages(body: dict[str, Any]) -> list[Message]:
    out: list[Message] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _text(body["system"], "system")})
    for n, message in enumerate(body["messages"], start=1):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"message {n} must be an object with a role")
        content = message.get("content")
        if isinstance(content, str) or content is None:
            out.append({"role": message["role"], "content": content or ""})
            continue
        if not isinstance(content, list):
            raise RequestError(f"message {n}: content must be a string or a list of blocks")
        text, reasoning, calls, results = [], [], [], []
        for block in content:
            if not isinstance(block, dict):
                raise RequestError(f"message {n}: every content block must be an object")
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind == "thinking":
                reasoning.append(str(block.get("thinking", "")))
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": str(block.get("id", "")),
                        "type": "function",
                        "function": {
                            "name": str(block.get("name", "")),
                            "arguments": block.get("input", {}),
                        },
                    }
                )
            elif kind == "tool_result":
                results.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": _text(block.get("content"), f"message {n}: tool_result"),
                    }
                )
        if message["role"] == "assistant":
            turn: Message = {"role": "assistant", "content": "".join(text)}
            if reasoning:
                turn["reasoning_content"] = "".join(reasoning)
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
        else:
            out.extend(results)
            if text or not results:
                out.append({"role": "user", "content": "".join(text)})
    return out


def _openai_message(message: Any, n: int) -> Message:
    """An OpenAI message as the serving engines hand it to the template: `content` null (an
    assistant turn that only calls tools) becomes "", and a list of text parts their text
    joined (mlx-lm's server does both; llama.cpp gives "" to a template that needs a string).
    transformers drops a None-valued key, so a template that adds `message.content` to a
    string fails on the raw body, where the server renders it. A list holding other parts
    (images) is kept as it is."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"message {n} must be an object with a role")
    out = dict(message)
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in content
    ):
        out["content"] = "".join(str(part.get("text", "")) for part in content)
    return out


def _anthropic_block(block: dict[str, Any]) -> bool:
    """A content block only Anthropic's API sends (OpenAI's parts are text, image_url, …;
    Mistral's thinking chunks carry no signature)."""
    kind = block.get("type")
    return (
        kind in ("tool_use", "tool_result", "redacted_thinking")
        or (kind == "thinking" and "signature" in block)
        or (kind in ("image", "document") and "source" in block)
    )


def parse_body(body: Any, where: str = "request") -> ClientRequest:
    """An OpenAI chat-completions or Anthropic messages request body, normalized."""
    if not isinstance(body, dict):
        raise RequestError(f"{where}: a request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(f'{where}: needs a non-empty "messages" list')
    anthropic = "system" in body or any(
        isinstance(m, dict)
        and isinstance(m.get("content"), list)
        and any(isinstance(b, dict) and _anthropic_block(b) for b in m["content"])
        for m in messages
    )
    raw_tools = body.get("tools")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise RequestError(f'{where}: "tools" must be a list')
    for number, tool in enumerate(raw_tools or (), start=1):
        if not isinstance(tool, dict):
            raise RequestError(f"{where}: tools item {number} must be an object")
        if "function" in tool and not isinstance(tool["function"], dict):
            raise RequestError(f'{where}: tools item {number}: "function" must be an object')
    try:
        if anthropic:
            normalized = _anthropic_messages(body)
            tools = (
                None
                if raw_tools is None
                else tuple(
                    {
                        "type": "function",
                        "function": {
                            "name": t.get("name", ""),
                            "description": t.get("description", ""),
                            "parameters": t.get("input_schema", {}),
                        },
                    }
                    if isinstance(t, dict) and "input_schema" in t
                    else t
                    for t in raw_tools
                )
            )
        else:
            normalized = [_openai_message(m, n) for n, m in enumerate(messages, start=1)]
            tools = None if raw_tools is None else tuple(raw_tools)
    except RequestError as exc:
        raise RequestError(f"{where}: {exc}") from None
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError(f'{where}: "chat_template_kwargs" must be an object')
    return ClientRequest(
        tuple(normalized), tools, dict(kwargs), "anthropic" if anthropic else "openai"
    )


def load_json(text: str | bytes) -> Any:
    """`json.loads` for a client's bodies: nesting too deep for the parser's recursion, or an
    integer past Python's 4,300 digits, is invalid JSON like any other (json raises
    RecursionError and a plain ValueError for them, which no caller expects)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc)[:120], "", 0) from None
    if _deeper_than(value, MAX_JSON_DEPTH):
        # Parsed, but written again for the sandbox, JSON's encoder recurses deeper per level
        # than its parser: a body just under the parser's limit failed there.
        raise json.JSONDecodeError(f"nested more than {MAX_JSON_DEPTH} levels deep", "", 0)
    return value


#: The deepest a client's JSON body may nest (a tool's parameter schema is a few levels).
MAX_JSON_DEPTH = 100


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests lists or objects more than `limit` levels deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_text(text: str, name: str) -> list[ClientRequest]:
    """One JSON body, a JSON list of bodies, or JSON Lines (one body per line)."""
    if len(text) > MAX_BODY_CHARS * 8:
        raise RequestError(f"{name}: over {MAX_BODY_CHARS * 8:,} characters")
    stripped = text.strip()
    if not stripped:
        raise RequestError(f"{name}: empty")
    try:
        whole = load_json(stripped)
    except json.JSONDecodeError:
        whole = None
        bodies = []
        for number, line in enumerate(stripped.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                bodies.append((f"{name} line {number}", load_json(line)))
            except json.JSONDecodeError as exc:
                raise RequestError(f"{name} line {number}: not valid JSON ({exc.msg})") from None
    else:
        if isinstance(whole, list):
            bodies = [(f"{name} item {n}", b) for n, b in enumerate(whole, start=1)]
        else:
            bodies = [(name, whole)]
    if len(bodies) > MAX_REQUESTS:
        raise RequestError(f"{name}: {len(bodies)} requests, at most {MAX_REQUESTS} at once")
    return [parse_body(body, where) for where, body in bodies]


def read_requests(paths: Iterable[Path]) -> list[ClientRequest]:
    requests: list[ClientRequest] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise RequestError(f"cannot read {path}: {exc}") from None
        requests += parse_text(text, str(path))
    if len(requests) < 2:
        raise RequestError("give at least two requests, in the order they were sent")
    return requests


# The client's side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """What the client changed between two requests, before any rendering."""

    cause: str
    message: int | None  # 1-based index in request k's messages (None: tools)
    field: str
    offset: int | None  # first differing character of that field
    before: str
    after: str
    detail: str


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _excerpt(text: str, at: int) -> str:
    start = max(0, at - 10)
    return text[start : at + EXCERPT]


def _field_text(message: Message, name: str) -> str:
    value = message.get(name)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _exact(value: Any) -> str:
    """What a template's `tojson` sees: JSON with the client's key order (dict equality
    ignores it, and tools or arguments sent again in another order are the client's change)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def _without_reasoning(message: Message) -> Message:
    return {k: v for k, v in message.items() if k not in _REASONING_KEYS}


def _changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ as a template writes them, in the order the two hold them."""
    return [k for k in dict.fromkeys([*old, *new]) if _exact(old.get(k)) != _exact(new.get(k))]


def _edited(index: int, old: Message, new: Message, cause: str = HISTORY_EDITED) -> Change:
    names = _changed_keys(old, new)
    name = names[0] if names else "content"
    a, b = _field_text(old, name), _field_text(new, name)
    at = _first_difference(a, b)
    role = old.get("role", "?")
    return Change(
        cause,
        index,
        name,
        at,
        _excerpt(a, at),
        _excerpt(b, at),
        f"{role} message {index} was sent with a different {name}",
    )


def _tools_change(
    old: Sequence[dict[str, Any]] | None, new: Sequence[dict[str, Any]] | None
) -> Change:
    def name(tool: dict[str, Any]) -> str:
        return str((tool.get("function") or tool).get("name", ""))

    old_list, new_list = list(old or ()), list(new or ())
    old_names, new_names = [name(t) for t in old_list], [name(t) for t in new_list]
    if not old_list and not new_list:  # one sent "tools": [], the other no "tools"
        a, b = json.dumps(old), json.dumps(new)
        said = (
            'an empty "tools" list was sent, where request k sent none'
            if old is None
            else 'the empty "tools" list was not sent again'
        )
        return Change(TOOLS_CHANGED, None, "tools", 0, a, b, said)
    if sorted(old_names) == sorted(new_names) and old_names != new_names:
        detail = (
            f"the same tools in another order ({', '.join(old_names)} → {', '.join(new_names)})"
        )
    elif old_names == new_names:
        canonical = [json.dumps(t, sort_keys=True) for t in old_list] == [
            json.dumps(t, sort_keys=True) for t in new_list
        ]
        detail = (
            "the same tool schemas serialized differently (key order)"
            if canonical
            else "a tool's schema changed"
        )
    else:
        added = sorted(set(new_names) - set(old_names))
        removed = sorted(set(old_names) - set(new_names))
        detail = "tools " + "; ".join(
            part
            for part in (
                f"added: {', '.join(added)}" if added else "",
                f"removed: {', '.join(removed)}" if removed else "",
            )
            if part
        )
    a = json.dumps(old_list, ensure_ascii=False)
    b = json.dumps(new_list, ensure_ascii=False)
    at = _first_difference(a, b)
    return Change(TOOLS_CHANGED, None, "tools", at, _excerpt(a, at), _excerpt(b, at), detail)


def _truncated(index: int, detail: str) -> Change:
    return Change(HISTORY_TRUNCATED, index + 1, "messages", None, "", "", detail)


def client_change(old: ClientRequest, new: ClientRequest) -> Change | None:
    """The first thing the client changed that request k+1 should have kept, in the order a
    template usually writes them: system prompt, tools, then each earlier message."""
    a, b = list(old.messages), list(new.messages)
    a_system = a[0] if a and a[0].get("role") in ("system", "developer") else None
    b_system = b[0] if b and b[0].get("role") in ("system", "developer") else None
    if _exact(a_system) != _exact(b_system):
        if a_system is not None and b_system is not None:
            change = _edited(1, a_system, b_system, SYSTEM_CHANGED)
            return Change(
                SYSTEM_CHANGED,
                1,
                change.field,
                change.offset,
                change.before,
                change.after,
                "the system prompt changed",
            )
        what = "appeared" if a_system is None else "was removed"
        return Change(SYSTEM_CHANGED, 1, "content", 0, "", "", f"a system prompt {what}")
    # "tools": [] is not the same as no "tools": the template gets [] rather than none, and
    # transformers takes `tool_use` for it.
    if _exact(old.tools) != _exact(new.tools):
        return _tools_change(old.tools, new.tools)
    offset = 1 if a_system is not None else 0
    a_keys, b_keys = [_exact(m) for m in a], [_exact(m) for m in b]
    for i in range(offset, len(a)):
        if i >= len(b):
            return _truncated(
                i, f"request k+1 has {len(b)} messages, fewer than the {len(a)} request k sent"
            )
        if a_keys[i] == b_keys[i]:
            continue
        # Messages removed here: what request k had at i comes back later, or request k+1 jumps
        # ahead to a later message of request k.
        if a_keys[i] in b_keys[i + 1 :] or b_keys[i] in a_keys[i + 1 :]:
            gone = next((j for j in range(i, len(a)) if a_keys[j] == b_keys[i]), None)
            removed = (gone - i) if gone is not None else None
            said = (
                f"{removed} earlier message{'s' if removed != 1 else ''}"
                if removed
                else "earlier messages"
            )
            return _truncated(i, f"{said} removed from message {i + 1} on")
        if a[i].get("role") != b[i].get("role") and a_keys[i] not in b_keys:
            # Not an edit (an edit keeps the role): gone, and a message request k never had
            # (the reply to it, say) takes its place.
            return _truncated(
                i, f"{a[i].get('role', '?')} message {i + 1} was removed from request k+1"
            )
        if a[i].get("role") == "assistant" and _exact(_without_reasoning(a[i])) == _exact(
            _without_reasoning(b[i])
        ):
            dropped = any(a[i].get(k) and not b[i].get(k) for k in _REASONING_KEYS)
            if dropped:
                key = next(k for k in _REASONING_KEYS if a[i].get(k))
                return Change(
                    REASONING_DROPPED,
                    i + 1,
                    key,
                    0,
                    _excerpt(str(a[i].get(key)), 0),
                    "",
                    f"assistant message {i + 1} lost its reasoning",
                )
        return _edited(i + 1, a[i], b[i])
    if names := _changed_keys(old.kwargs, new.kwargs):
        name = names[0]
        a_text, b_text = _field_text(old.kwargs, name), _field_text(new.kwargs, name)
        return Change(
            KWARGS_CHANGED,
            None,
            f"chat_template_kwargs.{name}",
            None,
            a_text[:EXCERPT],
            b_text[:EXCERPT],
            f"chat_template_kwargs {name} changed",
        )
    return None


# The template's side (in the sandbox) ------------------------------------------------------

HINTS = {
    NONE: "",
    SYSTEM_CHANGED: "The system prompt changes between requests: keep it byte-identical, and move "
    "what varies (a date, a nonce, the working directory) into the newest user message.",
    TOOLS_CHANGED: "Send the same tool definitions every time, in a fixed order (sort them by "
    "name) and serialized the same way (sorted keys).",
    HISTORY_EDITED: "Send earlier messages back exactly as they were sent before: an edited "
    "message re-reads everything after it.",
    REASONING_DROPPED: "Your client drops the reasoning of earlier assistant messages: send it "
    "back (reasoning_content), or pass the chat_template_kwargs that keep the template from "
    "writing it (the model's page says which).",
    HISTORY_TRUNCATED: "Earlier messages were removed (context trimming): everything after the cut "
    "is read again. Trim rarely and in large steps, or summarize at a fixed point.",
    KWARGS_CHANGED: "The chat_template_kwargs change between requests: send the same ones "
    "every time (a setting the template reads changes what it writes, and the prompt with it).",
    TEMPLATE: "The messages agree, but the template writes them differently once a turn is "
    "added: pick a setting or a model whose template is cache-safe (see its CacheSafe page).",
}


@dataclass(frozen=True)
class PairDiagnosis:
    """Request k → k+1 (1-based)."""

    index: int
    prompt_reuse: float
    cause: str
    where: dict[str, Any]
    hint: str
    detail: str
    unit: str = "bytes"
    reused: int = 0
    next_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.index,
            "to": self.index + 1,
            "prompt_reuse": self.prompt_reuse,
            "cause": self.cause,
            "where": self.where,
            "hint": self.hint,
            "detail": self.detail,
            "unit": self.unit,
            "reused": self.reused,
            "next_size": self.next_size,
        }


def _visible(text: str) -> str:
    """Whitespace made visible, for excerpts a reader compares by eye."""
    return text.replace("\\", "\\\\").replace("\n", "↵").replace("\t", "→").replace(" ", "·")


Render = Callable[[ClientRequest, bool], str]


def diagnose_pair(
    index: int,
    old: ClientRequest,
    new: ClientRequest,
    render: Render,
    line_at: Callable[[ClientRequest, int], int | None],
    tokens: Callable[[str], list[int]] | None = None,
) -> PairDiagnosis:
    """Diagnose one pair with `render(request, add_generation_prompt)`."""
    before, after = render(old, True), render(new, True)
    d = _first_difference(before, after)
    if tokens is not None:
        a, b = tokens(before), tokens(after)
        shared = _first_common(a, b)
        unit, reused, size = "tokens", shared, len(b)
    else:
        unit = "bytes"
        reused = len(after[:d].encode("utf-8", "surrogatepass"))
        size = len(after.encode("utf-8", "surrogatepass"))
    share = round(reused / size, 4) if size else 1.0
    change = client_change(old, new)
    if d >= len(before) and (tokens is None or reused >= len(tokens(before))):
        return PairDiagnosis(
            index, share, NONE, {}, "", "request k+1 extends request k", unit, reused, size
        )
    # Where does the client's change show up in the render? Undo it and render again.
    shows_at = len(after)
    if change is not None:
        cleaned = ClientRequest(
            old.messages + _appended(old.messages, new.messages),
            old.tools,
            old.kwargs if change.cause == KWARGS_CHANGED else new.kwargs,
            new.format,
        )
        try:
            shows_at = _first_difference(after, render(cleaned, True))
        except Exception:  # noqa: BLE001 - the template refuses the cleaned request: keep the client's
            shows_at = 0
    d_bytes = len(after[:d].encode("utf-8", "surrogatepass"))  # "byte N" on the page and table
    if change is not None and shows_at <= d:
        where = {
            "message": change.message,
            "field": change.field,
            "offset": change.offset,
            "render_offset": d_bytes,
            "before": _visible(change.before),
            "after": _visible(change.after),
        }
        return PairDiagnosis(
            index,
            share,
            change.cause,
            where,
            HINTS[change.cause],
            change.detail,
            unit,
            reused,
            size,
        )
    line = line_at(old, d)
    where = {
        "message": None,
        "field": "render",
        "offset": d,
        "render_offset": d_bytes,
        "template_line": line,
        "before": _visible(_excerpt(before, d)),
        "after": _visible(_excerpt(after, d)),
    }
    detail = "the template renders the same messages differently once a request is added"
    if line is not None:
        detail += f" (template line {line})"
    return PairDiagnosis(index, share, TEMPLATE, where, HINTS[TEMPLATE], detail, unit, reused, size)


def _appended(old: Sequence[Message], new: Sequence[Message]) -> tuple[Message, ...]:
    """What request k+1 adds after request k's messages (also when it edited or cut them)."""
    if len(new) > len(old) and (not old or new[len(old) - 1].get("role") == old[-1].get("role")):
        return tuple(new[len(old) :])
    if old:
        for j in range(len(new) - 1, -1, -1):
            if new[j] == old[-1]:
                return tuple(new[j + 1 :])
    return tuple(new[-1:])


def _first_common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def diagnose_renders(
    requests: Sequence[ClientRequest],
    template_for: Callable[[ClientRequest], Any],
    context: Callable[[ClientRequest, bool], dict[str, Any]],
    max_output_chars: int,
    tokens: Callable[[str], list[int]] | None = None,
) -> list[PairDiagnosis]:
    """Every consecutive pair; each request is rendered once (memoized by its JSON)."""
    from checks.rendering import render as render_text

    memo: dict[tuple[str, bool], str] = {}
    numbers = {id(request): n for n, request in enumerate(requests, start=1)}

    def render(request: ClientRequest, add_generation_prompt: bool) -> str:
        # Key order kept: a template's tojson writes it (sorted, a re-serialized request was
        # given the render of the one it was sorted like).
        key = (json.dumps(request.to_dict(), default=str), add_generation_prompt)
        if key not in memo:
            try:
                memo[key] = render_text(
                    template_for(request),
                    context(request, add_generation_prompt),
                    max_output_chars,
                )
            except (MemoryError, RecursionError):
                raise  # the sandbox's own answers for these
            except Exception as exc:
                number = numbers.get(id(request))
                if number is None:  # a request put back together: its failure is its own
                    raise
                raise RequestFailed(f"request {number}: {type(exc).__name__}: {exc}") from exc
        return memo[key]

    def line_at(request: ClientRequest, offset: int) -> int | None:
        try:
            _, spans = render_with_spans(
                template_for(request), context(request, True), max_output_chars, offset + 1
            )
        except Exception:  # noqa: BLE001 - attribution is best effort
            return None
        span = span_at(spans, offset)
        return span.line if span is not None else None

    return [
        diagnose_pair(k + 1, requests[k], requests[k + 1], render, line_at, tokens)
        for k in range(len(requests) - 1)
    ]


def diagnose_source(
    source: Any,
    requests: Sequence[ClientRequest],
    templates: Any,
    tokens: Callable[[str], list[int]] | None = None,
    max_output_chars: int | None = None,
) -> list[PairDiagnosis]:
    """Diagnose with a `TemplateSource` (the sandbox worker runs this). transformers' choice of
    named template: `tool_use` for requests that pass tools (an empty list too), else `default`
    (none: it raises)."""
    from checks.options import DEFAULT_MAX_OUTPUT_CHARS
    from checks.rendering import normalize_messages, template_context

    def pick(request: ClientRequest) -> str:
        # A request that sent "tools": [] passes tools, as the servers hand them on.
        name = unnamed_choice(source.templates, request.tools is not None)
        if name is None:
            raise ValueError(no_default_error(source.templates))
        return name

    def context(request: ClientRequest, add_generation_prompt: bool) -> dict[str, Any]:
        return template_context(
            normalize_messages([dict(m) for m in request.messages]),
            tools=None if request.tools is None else [dict(t) for t in request.tools],
            add_generation_prompt=add_generation_prompt,
            special_tokens=source.special_tokens,
            kwargs=request.kwargs,
        )

    def template_for(request: ClientRequest) -> Any:
        name = pick(request)
        return templates.get(f"{source.sha256}:{name}", source.templates[name])

    limit = max_output_chars or DEFAULT_MAX_OUTPUT_CHARS
    parsed = [with_object_arguments(request) for request in requests]
    if any(new is not old for new, old in zip(parsed, requests, strict=True)):
        # Tool-call arguments as the servers hand them to the template: parsed into objects
        # (mlx-lm's and vLLM's servers do). A template that refuses objects (DeepSeek R1's
        # adds them to a string) gets them as they were sent, for every request alike.
        try:
            return diagnose_renders(parsed, template_for, context, limit, tokens)
        except RequestFailed:
            pass
    return diagnose_renders(requests, template_for, context, limit, tokens)


def with_object_arguments(request: ClientRequest) -> ClientRequest:
    """`request` with each tool call's JSON-string arguments parsed into an object; the same
    request when none is (arguments that are not a JSON object stay as they were)."""
    messages = []
    changed = False
    for message in request.messages:
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            messages.append(message)
            continue
        parsed_calls = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                try:
                    value = json.loads(arguments)
                except (ValueError, RecursionError):
                    value = None
                if isinstance(value, dict):
                    call = {**call, "function": {**function, "arguments": value}}  # type: ignore[dict-item]
                    changed = True
            parsed_calls.append(call)
        messages.append({**message, "tool_calls": parsed_calls})
    return replace(request, messages=tuple(messages)) if changed else request
