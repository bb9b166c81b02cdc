"""A whole template check, as one sandbox worker runs it: variants × sessions × request pairs.

Renders are memoized (sessions share requests) and compiled templates come from a per-process cache.
Attribution (which line wrote which bytes) only runs for pairs that do not pass.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import jinja2

from checks import findings, policy
from checks.attribution import Span, render_with_spans
from checks.clients import PROFILES, REASONING_DROPPED, THINKING_CHUNKS, TYPICAL, ClientProfile
from checks.comparison import (
    PairInput,
    byte_length,
    common_prefix,
    compare_pair,
    generation_prompt_closes_thinking,
    generation_prompt_opens_thinking,
)
from checks.conversations import (
    SESSIONS,
    TOOLS,
    Session,
    with_reasoning,
    with_string_arguments,
    without_reasoning,
)
from checks.options import DEFAULT_NOW, ENGINE_VERSION, CheckOptions
from checks.policy import CLOCK_DETAIL, PRIMARY_KWARGS
from checks.rendering import (
    RenderLimitError,
    TemplateCache,
    normalize_messages,
    plain_data,
    render,
    template_context,
)
from checks.reports import (
    HISTORY,
    Finding,
    RequestPair,
    SessionResult,
    TemplateReport,
    VariantResult,
    error_report,
)
from checks.reuse import BLOCK, CACHE_CLASSES, Stored, bar, reused, shared_prefixes_with
from checks.seedcheck import run_seed_check
from checks.sources import DEFAULT, TemplateSource, no_default_error, unnamed_choice
from checks.variants import (
    Variant,
    kwargs_read,
    plan_variants,
    reads_field,
    reads_reasoning,
    reads_thinking_chunks,
    remember_resolved,
    thinking_kwargs,
)

# How far the clock moves between request k and k+1 of a session. A real agent loop's requests
# are minutes apart, so a template writing the time of day (`strftime_now('%H:%M')`) changes its
# prefix on every request; a pinned clock would hide that. Minutes, seconds and (from the default
# 09:30 start) the hour all change within a session, the date does not: a date-only format is
# stable within a day, and the date finding says it changes at midnight.
CLOCK_STEP = timedelta(minutes=17, seconds=13)


class FatalTemplateError(Exception):
    """The template hit a limit or the sandbox: the whole check ends as an `error` verdict."""


class RenderFailed(Exception):
    """The template refused this conversation (raise_exception, undefined, type error)."""


@dataclass(frozen=True)
class RenderCall:
    """One render the engine asks for: what the differential test replays through transformers."""

    template_name: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    add_generation_prompt: bool
    kwargs: tuple[tuple[str, Any], ...]
    now: datetime = DEFAULT_NOW  # what strftime_now read

    def context(self, special_tokens: dict[str, str]) -> dict[str, Any]:
        """The variables the template sees, built afresh as transformers builds them."""
        return template_context(
            normalize_messages(list(self.messages)),
            tools=None if self.tools is None else list(self.tools),
            add_generation_prompt=self.add_generation_prompt,
            special_tokens=special_tokens,
            kwargs=dict(self.kwargs),
        )


def template_line(exc: BaseException) -> int | None:
    """The template line that raised: the last frame of the template's generated code (filename
    `<template>`) is where the error happened (a macro's body rather than its call). Its Python
    line maps to the template's through the debug info, as Jinja's traceback rewriting maps it;
    a traceback Jinja did rewrite (`Template.render`, attribution) already carries template
    lines."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        # Jinja's own helpers compiled into the template (`@internalcode`, such as the stand-in
        # for an unknown filter) are not the template's lines: Jinja's traceback skips them too.
        code = tb.tb_frame.f_code
        if code.co_filename == "<template>" and code not in jinja2.utils.internal_code:
            compiled = tb.tb_frame.f_globals.get("__jinja_template__")
            line = (
                tb.tb_lineno
                if compiled is None
                else compiled.get_corresponding_lineno(tb.tb_lineno)
            )
        tb = tb.tb_next
    return line


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    described = f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
    line = template_line(exc)
    return f"{described} (template line {line})" if line is not None else described


def fatal_reason(exc: BaseException) -> str | None:
    """Why to stop the whole check, or None when the error is the template's normal refusal."""
    line = template_line(exc)
    where = f" (template line {line})" if line is not None else ""
    if isinstance(exc, RenderLimitError):
        return f"{exc}{where}"
    if isinstance(exc, RecursionError):
        return f"template recursion too deep{where}"
    if isinstance(exc, jinja2.exceptions.SecurityError):
        return f"sandbox refused unsafe access: {exc}"
    return None


def _key(value: Any) -> str:
    # Key order is kept: a template iterating `.items()` renders differently when it changes.
    return json.dumps(value, default=str)


# The tool lists renders see (the engine's own TOOLS), as plain data, shared by every check in a
# process: the environment writes each one's JSON once (CheckEnvironment.freeze).
_PLAIN_TOOLS: dict[int, tuple[list[dict[str, Any]], str, Any]] = {}


def _plain_tools(tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, Any]:
    entry = _PLAIN_TOOLS.get(id(tools))
    if entry is None or entry[0] is not tools:
        if len(_PLAIN_TOOLS) > 64:
            _PLAIN_TOOLS.clear()
        entry = _PLAIN_TOOLS[id(tools)] = (tools, _key(tools), plain_data(tools))
    return entry


@dataclass(frozen=True)
class ReasoningProfile:
    reads_reasoning: bool
    switches: tuple[str, ...]
    reads_tool_calls: bool
    reads_thinking_chunks: bool = False


@dataclass
class Renderer:
    """Renders one template source under memoization, and with attribution on demand."""

    source: TemplateSource
    templates: TemplateCache
    options: CheckOptions
    observer: Callable[[RenderCall], None] | None = None
    tokens: Callable[[str], list[int]] | None = None
    profiles: dict[str, ReasoningProfile] = field(default_factory=dict)
    # Named templates that call strftime_now: only their renders depend on the clock tick.
    clocked: set[str] = field(default_factory=set)
    _memo: dict[tuple[Any, ...], str | RenderFailed] = field(default_factory=dict)
    _spans: dict[tuple[Any, ...], tuple[int, list[Span]]] = field(default_factory=dict)
    # Per message object (requests are prefixes of one tuple of messages, so each message is
    # keyed and normalized once, not once per request that carries it). The object is kept
    # beside its entry so that its id cannot be reused by another message.
    _messages: dict[int, tuple[dict[str, Any], str, dict[str, Any]]] = field(default_factory=dict)
    # Per request, by the ids of its messages: (the messages, kept alive so that no id is
    # reused; their keys; their normalized forms).
    _requests: dict[
        tuple[int, ...],
        tuple[tuple[dict[str, Any], ...], tuple[str, ...], list[dict[str, Any]]],
    ] = field(default_factory=dict)
    renders: int = 0

    def _message(self, message: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
        entry = self._messages.get(id(message))
        if entry is None or entry[0] is not message:
            entry = (message, _key(message), normalize_messages([message])[0])
            self._messages[id(message)] = entry
        return entry

    def _request(
        self, messages: tuple[dict[str, Any], ...]
    ) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...], list[dict[str, Any]]]:
        ids = tuple(map(id, messages))
        entry = self._requests.get(ids)
        if entry is None:
            known = [self._message(message) for message in messages]
            entry = (messages, tuple(k[1] for k in known), [k[2] for k in known])
            self._requests[ids] = entry
        return entry

    def _tool_list(self, tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, Any]:
        entry = _plain_tools(tools)
        self.templates.environment.freeze(entry[2])  # once per environment: then one lookup
        return entry

    def _tools_key(self, tools: list[dict[str, Any]] | None) -> str | bool:
        return False if tools is None else self._tool_list(tools)[1]

    def pick(self, variant: Variant, tools: list[dict[str, Any]] | None) -> str | None:
        """The named template transformers would use: `tool_use` when tools are passed; None
        where it raises (named templates with no `default`, a request without tools)."""
        name = variant.template_name
        if name != DEFAULT:
            return name
        return unnamed_choice(self.source.templates, tools is not None)

    def resolve(self, variant: Variant, tools: list[dict[str, Any]] | None) -> str:
        """As `pick`; where transformers raises, RenderFailed with its words."""
        name = self.pick(variant, tools)
        if name is None:
            raise RenderFailed(f"ValueError: {no_default_error(self.source.names)}")
        return name

    def used(self, variant: Variant) -> set[str]:
        """The templates a variant renders with, for requests without tools and with them."""
        return {n for n in (self.pick(variant, None), self.pick(variant, TOOLS)) if n is not None}

    def template(self, name: str) -> jinja2.Template:
        text = self.source.templates[name]
        return self.templates.get(f"{self.source.sha256}:{name}", text)

    def parsed(self, name: str) -> jinja2.nodes.Template:
        text = self.source.templates[name]
        compiled = self.templates.get_parsed(f"{self.source.sha256}:{name}", text)
        remember_resolved(compiled.ast, compiled.resolved)
        return compiled.ast

    def context(
        self,
        variant: Variant,
        messages: tuple[dict[str, Any], ...],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> dict[str, Any]:
        # Renders may share the normalized messages: the immutable sandbox lets no template
        # change a dict or list it is given.
        context = template_context(
            self._request(messages)[2],
            tools=None,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.source.special_tokens,
            kwargs=variant.kwargs_dict,
        )
        if tools is not None:
            context["tools"] = self._tool_list(tools)[2]
        return context

    def _tick(self, name: str, tick: int) -> int:
        """The tick that matters: always 0 for a template that never reads the clock, so its
        renders are shared across the requests of every session."""
        return tick if name in self.clocked else 0

    def _set_clock(self, tick: int) -> datetime:
        now = self.options.now + tick * CLOCK_STEP
        self.templates.environment.now = now
        return now

    def render(
        self,
        variant: Variant,
        messages: tuple[dict[str, Any], ...],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        tick: int = 0,
    ) -> str:
        """Render with the clock at `tick` steps of CLOCK_STEP past the options' clock."""
        name = self.resolve(variant, tools)
        tick = self._tick(name, tick)
        key = (
            # By the template it resolves to: the caller who names none shares the renders of
            # `tool_use` named.
            name,
            variant.kwargs,
            self._request(messages)[1],
            self._tools_key(tools),
            add_generation_prompt,
            tick,
        )
        cached = self._memo.get(key)
        if cached is None:
            now = self._set_clock(tick)
            if self.observer is not None:
                self.observer(
                    RenderCall(
                        name,
                        messages,
                        None if tools is None else tuple(tools),
                        add_generation_prompt,
                        variant.kwargs,
                        now,
                    )
                )
            self.renders += 1
            try:
                cached = render(
                    self.template(name),
                    self.context(variant, messages, tools, add_generation_prompt),
                    self.options.max_output_chars,
                )
            except MemoryError:
                # The sandbox worker answers this one: it knows the limit and must restart.
                raise
            except Exception as exc:
                reason = fatal_reason(exc)
                if reason is not None:
                    raise FatalTemplateError(reason) from exc
                cached = RenderFailed(describe_error(exc))
            self._memo[key] = cached
        if isinstance(cached, RenderFailed):
            # A fresh exception each time: re-raising one instance would grow its traceback.
            raise RenderFailed(str(cached))
        return cached

    def spans(
        self,
        variant: Variant,
        messages: tuple[dict[str, Any], ...],
        tools: list[dict[str, Any]] | None,
        until: int,
        tick: int = 0,
    ) -> list[Span]:
        """Attribution of the render up to character `until` (rendering stops there)."""
        # Keyed by the text: variants that render the same bytes share one attribution.
        text = self.render(variant, messages, tools, True, tick)
        name = self.resolve(variant, tools)
        key = (name, text, tools is not None)
        cached = self._spans.get(key)
        if cached is not None and cached[0] >= until:
            return cached[1]
        self._set_clock(self._tick(name, tick))
        context = self.context(variant, messages, tools, True)
        try:
            _, spans = render_with_spans(
                self.template(name), context, self.options.max_output_chars, until
            )
        except Exception:  # noqa: BLE001 - rendered fine a moment ago; attribution is best effort
            spans = []
        self._spans[key] = (until, spans)
        return spans


def _repr_leak(prompts: list[str], messages: tuple[dict[str, Any], ...]) -> bool:
    """Did the template print dict arguments as a Python repr (unusable for the model)?"""
    for message in messages:
        for call in message.get("tool_calls") or ():
            arguments = call["function"]["arguments"]
            if isinstance(arguments, dict) and any(str(arguments) in p for p in prompts):
                return True
    return False


_SWITCH = re.compile(r"^(enable_)?(thinking|reasoning)$")


# How a variant treats reasoning, which decides what replies a model can emit under it.
NO_REASONING = "none"  # the template never writes reasoning back: reasoning is not its concern
REASONING_OFF = "off"  # thinking switched off: replies carry no reasoning
REASONING_FORCED = "forced"  # the generation prompt opens a think block: every reply reasons
REASONING_FREE = "free"  # the model may reason; replies reason where the session says so


def _generation_prompt(renderer: Renderer, variant: Variant) -> str | None:
    first = SESSIONS[0].messages[:2]
    try:
        prompt = renderer.render(variant, first, None, True)
        history = renderer.render(variant, first, None, False)
    except RenderFailed:
        return None
    return prompt[common_prefix(history, prompt) :]


def _switched_off(renderer: Renderer, variant: Variant, switch: str) -> bool:
    """Explicitly False, or unset where the template renders unset exactly like False."""
    kwargs = variant.kwargs_dict
    if switch in kwargs:
        return kwargs[switch] is False
    first = SESSIONS[0].messages[:2]
    name = variant.template_name
    try:
        unset = renderer.render(variant, first, None, True)
        off = renderer.render(Variant(name, (*variant.kwargs, (switch, False))), first, None, True)
        on = renderer.render(Variant(name, (*variant.kwargs, (switch, True))), first, None, True)
    except RenderFailed:
        return False
    return unset == off != on


def reasoning_mode(renderer: Renderer, variant: Variant) -> str:
    if renderer.pick(variant, None) is None:
        # No `default`: without a name only requests with tools render, and their template
        # decides (none: nothing renders).
        named = renderer.pick(variant, TOOLS)
        if named is None:
            return NO_REASONING
        variant = Variant(named, variant.kwargs)
    profile = renderer.profiles[variant.template_name]
    if not profile.reads_reasoning:
        return NO_REASONING
    if any(_switched_off(renderer, variant, switch) for switch in profile.switches):
        return REASONING_OFF
    generation_prompt = _generation_prompt(renderer, variant) or ""
    if generation_prompt_closes_thinking(generation_prompt):
        return REASONING_OFF
    if generation_prompt_opens_thinking(generation_prompt):
        return REASONING_FORCED
    return REASONING_FREE


def emitted_reply(
    renderer: Renderer,
    variant: Variant,
    request: tuple[dict[str, Any], ...],
    reply: dict[str, Any],
    tools: list[dict[str, Any]] | None,
    prompt: str,
    tick: int,
    reasons: bool,
) -> str:
    """The reply as the engine holds it after generating: what the template writes for that turn
    after the prompt (a model trained on the template emits that), up to its end-of-turn token.

    The Mac probe forces the same reply in tokens (probe.rendering.forced_reply). Reasoning the
    model emitted but the template does not write even for the last turn goes first."""
    reasoning = reply.get("reasoning_content") or ""
    text = reply.get("content") or ""
    # Where the reasoning goes in: its field, or (Mistral style) a thinking chunk.
    forms = [reply]
    if (
        reasons
        and reasoning
        and renderer.profiles[renderer.resolve(variant, tools)].reads_thinking_chunks
    ):
        forms.append(THINKING_CHUNKS.history((reply,))[0])
    for form in forms:
        try:
            turn = renderer.render(variant, (*request, form), tools, False, tick)
        except RenderFailed:
            continue
        text = turn[common_prefix(prompt, turn) :]
        eos = renderer.source.special_tokens.get("eos_token")
        if eos and eos in text:
            text = text[: text.index(eos) + len(eos)]
        if not reasons or not reasoning or reasoning in text:
            return text
    if reasons and reasoning and reasoning not in text:
        text = reasoning + text
    return text


def _system_end(
    renderer: Renderer,
    variant: Variant,
    request: tuple[dict[str, Any], ...],
    tools: list[dict[str, Any]] | None,
    prompt: str,
    tick: int,
) -> int:
    """Where mlx_lm.server's batched path checkpoints the end of the system prompt (chars of
    `prompt`; 0 for none): only for a request that ends on a user message."""
    systems = 0
    while systems < len(request) and request[systems].get("role") == "system":
        systems += 1
    if not systems or request[-1].get("role") != "user":
        return 0
    try:
        alone = renderer.render(
            variant, (*request[:systems], {"role": "user", "content": ""}), tools, False, tick
        )
    except RenderFailed:
        return 0
    n = common_prefix(alone, prompt)
    # The server takes the first differing position; a render that never differs gives none.
    return n if n < min(len(alone), len(prompt)) else 0


def _with_reuse(
    renderer: Renderer,
    pairs: list[RequestPair],
    prompts: list[str],
    held: list[str],
    system_ends: list[int],
) -> list[RequestPair]:
    """Add each engine cache class's reuse (checks.reuse) to the pairs: every request so far is
    stored, as a prompt cache keeps them, with the checkpoints mlx_lm.server's batched path takes
    (end of the system prompt, the prompt's last token)."""
    tokens = renderer.tokens
    stored: list[Stored] = []
    out = []
    for k, pair in enumerate(pairs):
        nxt = prompts[k + 1]
        if tokens is not None:
            prompt_seq: Any = tokens(prompts[k])
            held_seq: Any = prompt_seq + tokens(held[k][len(prompts[k]) :])
            next_seq: Any = tokens(nxt)
            system = len(tokens(prompts[k][: system_ends[k]])) if system_ends[k] else 0
        else:
            prompt_seq, held_seq, next_seq = prompts[k], held[k], nxt
            system = system_ends[k]
        marks = tuple(n for n in (system, len(prompt_seq) - 1) if n > 0)
        stored.append(Stored(held_seq, marks))
        reuse: dict[str, int | None] = {}
        needed: dict[str, int | None] = {}
        shared = shared_prefixes_with(stored, next_seq)
        for cache_class in CACHE_CLASSES:
            if tokens is None and cache_class == BLOCK:
                reuse[cache_class] = needed[cache_class] = None  # blocks are counted in tokens
                continue
            got = reused(cache_class, stored, next_seq, shared_prefixes=shared)
            need = bar(cache_class, stored[-1], len(prompt_seq), len(next_seq))
            if tokens is None:  # characters to bytes, along the sequence each count indexes
                got, need = byte_length(nxt[:got]), byte_length(held[k][:need])
            reuse[cache_class], needed[cache_class] = got, need
        size = len if tokens is not None else byte_length
        out.append(
            replace(
                pair,
                unit="tokens" if tokens is not None else "bytes",
                prompt_units=size(prompt_seq),
                held_units=size(held_seq),
                next_units=size(next_seq),
                reuse=reuse,
                needed=needed,
            )
        )
    return out


def run_session(
    renderer: Renderer,
    variant: Variant,
    session: Session,
    mode: str = NO_REASONING,
    client: ClientProfile = TYPICAL,
) -> SessionResult:
    """Render every request of a session as `client` sends it and compare each consecutive pair.

    Replies follow the variant: with thinking forced every reply reasons, with it off none does.
    The model emits the same reply whatever the client; the client decides what goes back.
    """
    tools = TOOLS if session.uses_tools else None
    ends = session.request_ends()
    has_calls = any(m.get("tool_calls") for m in session.messages)
    forms = client.argument_forms(has_calls)
    try:
        renderer.resolve(variant, tools)
    except RenderFailed as exc:  # no template to render it with: whatever the arguments' form
        return SessionResult(session.name, False, forms[-1], str(exc), len(ends), ())
    errors: list[str] = []
    chosen: tuple[str, tuple[dict[str, Any], ...], tuple[dict[str, Any], ...], list[str]] | None
    chosen = None
    for form in forms:
        truth, messages = sent_messages(session, mode, client, form)
        try:
            # Request k is sent k clock steps after the first (see CLOCK_STEP).
            prompts = [
                renderer.render(variant, messages[:end], tools, True, tick)
                for tick, end in enumerate(ends)
            ]
        except RenderFailed as exc:
            errors.append(f"{form} arguments: {exc}" if has_calls else str(exc))
            continue
        if form == "dict" and _repr_leak(prompts, messages):
            errors.append("dict arguments: printed as a Python repr")
            if len(forms) > 1:
                chosen = chosen or (form, messages, truth, prompts)
                continue
        chosen = (form, messages, truth, prompts)
        break
    if chosen is None:
        return SessionResult(session.name, False, forms[-1], "; ".join(errors), len(ends), ())
    form, messages, truth, prompts = chosen
    reasons = mode in (REASONING_FORCED, REASONING_FREE)
    pairs = []
    held: list[str] = []
    system_ends: list[int] = []
    for k in range(len(ends) - 1):
        request, next_request = messages[: ends[k]], messages[: ends[k + 1]]
        reply = truth[ends[k]]

        def history(request: tuple[dict[str, Any], ...] = request, tick: int = k) -> str:
            try:
                return renderer.render(variant, request, tools, False, tick)
            except RenderFailed:
                return ""

        def spans(
            until: int,
            request: tuple[dict[str, Any], ...] = request,
            next_request: tuple[dict[str, Any], ...] = next_request,
            tick: int = k,
        ) -> tuple[list[Span], list[Span]]:
            if client is not TYPICAL:
                # Only the typical client's pairs get a page and a matrix cell: the others say
                # what broke without paying for line attribution.
                return [], []
            return (
                renderer.spans(variant, request, tools, until, tick),
                renderer.spans(variant, next_request, tools, until, tick + 1),
            )

        reasons_here = False
        if reasons and reply.get("reasoning_content"):
            generation_prompt = prompts[k][common_prefix(history(), prompts[k]) :]
            reasons_here = not generation_prompt_closes_thinking(generation_prompt)
        emitted = emitted_reply(
            renderer, variant, request, reply, tools, prompts[k], k, reasons_here
        )
        held.append(prompts[k] + emitted)
        system_ends.append(_system_end(renderer, variant, request, tools, prompts[k], k))
        pairs.append(
            _blame_clock(
                renderer,
                variant,
                prompts[k],
                next_request,
                tools,
                k,
                compare_pair(
                    PairInput(
                        session=session.name,
                        index=k + 1,
                        prompt=prompts[k],
                        next_prompt=prompts[k + 1],
                        reply=reply,
                        model_reasons=reasons_here,
                        check_tool_calls=renderer.profiles[
                            renderer.resolve(variant, tools)
                        ].reads_tool_calls,
                        history=history,
                        spans=spans,
                        tokens=renderer.tokens,
                        emitted=emitted,
                        client_drops_reasoning=bool(reply.get("reasoning_content"))
                        and client.reasoning == REASONING_DROPPED,
                    )
                ),
            )
        )
    for k, pair in enumerate(pairs):
        if pair.status == "reply" and prompts[k + 1].startswith(held[k]):
            # The template writes none of what the model emitted (a tool call, the content):
            # the engine holds those tokens all the same, right after the prompt.
            held[k] = prompts[k] + _unwritten(truth[ends[k]]) + held[k][len(prompts[k]) :]
    pairs = _with_reuse(renderer, pairs, prompts, held, system_ends)
    error = "; ".join(errors) if errors and (form != "dict" or len(forms) == 1) else None
    return SessionResult(session.name, True, form, error, len(ends), tuple(pairs))


def _unwritten(reply: dict[str, Any]) -> str:
    """A stand-in for reply tokens no rendering shows: the reasoning, the calls, the content."""
    calls = [
        json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
        for c in reply.get("tool_calls") or ()
    ]
    return (reply.get("reasoning_content") or "") + "".join(calls) + (reply.get("content") or "")


def _emitted_messages(session: Session, mode: str) -> tuple[dict[str, Any], ...]:
    """The session's messages as the model emits them under a reasoning mode."""
    if mode == REASONING_FORCED:
        return with_reasoning(session.messages)
    if mode == REASONING_OFF:
        return without_reasoning(session.messages)
    return session.messages


def _blame_clock(
    renderer: Renderer,
    variant: Variant,
    prompt: str,
    next_request: tuple[dict[str, Any], ...],
    tools: list[dict[str, Any]] | None,
    k: int,
    pair: RequestPair,
) -> RequestPair:
    """Say so when a history break is the clock: with request k+1 rendered at request k's time
    the divergence moves later or goes away. The cause stays `history` (the prefix really breaks
    on every request); the detail names the time in the prompt."""
    name = renderer.resolve(variant, tools)
    div = pair.divergence
    if pair.cause != HISTORY or div is None or name not in renderer.clocked:
        return pair
    try:
        same_clock = renderer.render(variant, next_request, tools, True, k)
    except RenderFailed:
        return pair
    if common_prefix(prompt, same_clock) <= div.char_offset:
        return pair  # at one time the prefix breaks at the same byte: not the clock's doing
    lines = ", ".join(map(str, dict.fromkeys(div.lines_before + div.lines_after)))
    where = f" (template line {lines})" if lines else ""
    return replace(pair, detail=f"{CLOCK_DETAIL}{where}")


def _same_as_typical(client: ClientProfile, renderer: Renderer, variant: Variant, mode: str) -> str:
    """Why `client` renders like the typical client under this setting ("" if it may not)."""
    profiles = [renderer.profiles[name] for name in renderer.used(variant)]
    if client.reasoning != TYPICAL.reasoning:
        if mode == NO_REASONING:
            return "the template never writes reasoning into history"
        if mode == REASONING_OFF:
            return "no reasoning with this setting"
    if client.arguments != TYPICAL.arguments and not any(p.reads_tool_calls for p in profiles):
        return "the template never reads tool calls"
    return ""


def run_variant(renderer: Renderer, variant: Variant) -> VariantResult:
    mode = reasoning_mode(renderer, variant)
    typical = tuple(run_session(renderer, variant, session, mode) for session in SESSIONS)
    first = policy.client_result(TYPICAL.name, typical, "", keep_sessions=False)
    clients = [first]
    reads_chunks = any(
        renderer.profiles[name].reads_thinking_chunks for name in renderer.used(variant)
    )
    for client in PROFILES[1:]:
        same = _same_as_typical(client, renderer, variant, mode)
        if same:
            clients.append(replace(first, profile=client.name, note=same))
            continue
        if client.reasoning == "chunks" and not reads_chunks:
            clients.append(
                policy.not_applicable(
                    client.name, "the template never reads reasoning sent as thinking chunks"
                )
            )
            continue
        sessions = []
        for session, ours in zip(SESSIONS, typical, strict=True):
            base = _emitted_messages(session, mode)
            has_calls = any(m.get("tool_calls") for m in session.messages)
            if client.history(base) == TYPICAL.history(base) and client.argument_forms(
                has_calls
            ) == TYPICAL.argument_forms(has_calls):
                sessions.append(ours)  # this session sends the same requests
            else:
                sessions.append(run_session(renderer, variant, session, mode, client))
        clients.append(policy.client_result(client.name, tuple(sessions), "", keep_sessions=True))
    return VariantResult(
        template_name=variant.template_name,
        kwargs=variant.kwargs_dict,
        label=variant.label,
        verdict=policy.variant_verdict(typical),
        sessions=typical,
        mean_reusable_share=policy.mean_share(typical),
        clients=tuple(clients),
    )


def _date_note(found: tuple[Finding, ...], variants: tuple[VariantResult, ...]) -> str:
    """Dates are the caller's clock, not a render difference: say so beside the verdict.

    The time of day is a render difference (request k+1 comes minutes after request k): when a
    pair broke on it, say that the time is in the prompt and where."""
    for variant in variants:
        for session in variant.sessions:
            for pair in session.pairs:
                if pair.detail.startswith(CLOCK_DETAIL):
                    where = pair.detail[len(CLOCK_DETAIL) :].strip(" ()")
                    return (
                        f" The prompt includes the current time ({where or 'strftime_now'}): "
                        "it changes between requests, so the cached prefix stops matching there "
                        "on every request."
                    )
    for finding in found:
        if finding.kind == findings.DATE_DEPENDENT:
            lines = ", ".join(map(str, finding.lines))
            return (
                f" The prompt includes the current date (template line {lines}): a cached "
                "prefix stops matching when the date changes."
            )
    return ""


def _memoized(
    tokens: Callable[[str], list[int]] | None,
) -> Callable[[str], list[int]] | None:
    """Encode each distinct render once: pairs share requests, variants share renders."""
    if tokens is None:
        return None
    encode = tokens
    seen: dict[str, list[int]] = {}

    def cached(text: str) -> list[int]:
        ids = seen.get(text)
        if ids is None:
            ids = seen[text] = encode(text)
        return ids

    return cached


def learn(renderer: Renderer, asts: dict[str, jinja2.nodes.Template]) -> None:
    """What the renderer must know of each named template: does it read the clock, reasoning,
    tool calls, thinking chunks, and which switches turn thinking off."""
    renderer.clocked |= {name for name, ast in asts.items() if findings.reads_clock(ast)}
    for name, ast in asts.items():
        switches = tuple(n for n in thinking_kwargs(ast) if _SWITCH.match(n))
        renderer.profiles[name] = ReasoningProfile(
            reads_reasoning(ast),
            switches,
            reads_field(ast, {"tool_calls"}),
            reads_thinking_chunks(ast),
        )


Sent = tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]
# Built once per process and shared by every check: the same message objects each time, so a
# renderer keys and normalizes each message once (Renderer._message), not once per variant.
# Nothing changes them: the immutable sandbox keeps templates from it.
_SENT: dict[tuple[int, str, int, str], tuple[Session, ClientProfile, Sent]] = {}


def sent_messages(session: Session, mode: str, client: ClientProfile, form: str) -> Sent:
    """(what the model emitted, what the client sends back) for a session under a reasoning
    mode, a client profile and a tool-argument form: the one rule run_session and the pair
    page use."""
    key = (id(session), mode, id(client), form)
    entry = _SENT.get(key)
    if entry is None or entry[0] is not session or entry[1] is not client:
        base = _emitted_messages(session, mode)
        truth = with_string_arguments(base) if form == "string" else base
        if len(_SENT) > 1024:
            _SENT.clear()
        entry = _SENT[key] = (session, client, (truth, client.history(truth)))
    return entry[2]


def run_check(
    source: TemplateSource,
    templates: TemplateCache,
    *,
    file: str = "",
    options: CheckOptions | None = None,
    tokens: Callable[[str], list[int]] | None = None,
    tokenizer_sha: str | None = None,
    observer: Callable[[RenderCall], None] | None = None,
) -> TemplateReport:
    """Check one template source in this process (the sandbox worker calls this)."""
    started = time.perf_counter()
    if not any(text.strip() for text in source.templates.values()):
        # It renders nothing for every conversation, which no check could call unsafe: not a
        # verdict to give (a CI gate would pass an empty file).
        return error_report(
            source, file, "the template is empty: it renders nothing", started, tokenizer_sha
        )
    options = options or CheckOptions()
    templates.environment.now = options.now
    renderer = Renderer(source, templates, options, observer, _memoized(tokens))
    try:
        asts = {name: renderer.parsed(name) for name in source.templates}
    except jinja2.TemplateSyntaxError as exc:
        reason = f"template syntax error at line {exc.lineno}: {exc.message}"
        return error_report(source, file, reason, started, tokenizer_sha)
    learn(renderer, asts)
    try:
        planned = plan_variants(asts)
        variants = tuple(run_variant(renderer, v) for v in planned)
        # The literal check runs with the settings its readers use: defaults and enable_thinking.
        seed = []
        seed_variants = [
            v
            for v in planned
            if v.template_name == planned[0].template_name and set(v.kwargs) <= PRIMARY_KWARGS
        ]
        for variant in seed_variants:

            def seed_render(
                messages: list[dict[str, Any]],
                tools: list[dict[str, Any]],
                add_generation_prompt: bool,
                variant: Variant = variant,
            ) -> str:
                return renderer.render(variant, tuple(messages), tools, add_generation_prompt)

            seed += run_seed_check(seed_render, variant.label)
    except FatalTemplateError as exc:
        return error_report(source, file, str(exc), started, tokenizer_sha)
    try:
        drafts = [draft for ast in asts.values() for draft in findings.static_findings(ast)]
        linked = findings.link_findings(drafts, variants)
    except Exception:  # noqa: BLE001 - findings are advisory; a strange AST must not cost the verdict
        linked = ()
    verdict, summary, why = policy.judge(variants, source.names)
    read = sorted({name for ast in asts.values() for name in kwargs_read(ast)})
    return TemplateReport(
        file=file,
        origin=source.origin,
        sha256=source.sha256,
        engine_version=ENGINE_VERSION,
        verdict=verdict,
        summary=summary + _date_note(linked, variants),
        reason=why,
        template_names=source.names,
        kwargs_read=tuple(read),
        variants=variants,
        failures=policy.failure_rows(variants),
        findings=linked,
        seed_check=tuple(seed),
        tokenizer_sha256=tokenizer_sha,
        elapsed_seconds=round(time.perf_counter() - started, 4),
        renders=renderer.renders,
    )
