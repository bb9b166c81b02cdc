"""Render chat templates exactly as transformers 5.x `apply_chat_template` does, inside limits.

The environment mirrors `transformers/utils/chat_template_utils.py`
(`_cached_compile_jinja_template`) and the input normalization of `apply_chat_template` +
`render_jinja_template`. transformers itself is only a test dependency:
`tests/checks/test_rendering.py` proves the two agree byte for byte.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from checks.options import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_NOW

# Message fields a model's reasoning is passed under; transformers aliases them all.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# Strings and lists a template builds with `*`, `**` or `+` may not exceed this many items.
DEFAULT_MAX_VALUE_ITEMS = 4 * 1024 * 1024


class RenderLimitError(Exception):
    """A template tried to produce more than a limit allows (output flood, string bomb)."""


class GenerationExtension(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` renders its body, like transformers' tracker."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation_support")
        block = jinja2.nodes.CallBlock(call, [], [], body)
        block.set_lineno(lineno)
        return block

    def _generation_support(self, caller: Callable[[], str]) -> str:
        return caller()


class TemplateDict:
    """transformers 5.x `dict` global: `fromkeys`, nothing to reach CPython through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """transformers 5.x `namespace` global: rejects underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute."
            )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, str | list | tuple) else None


_DICT_ATTRIBUTES = frozenset(dir(dict))


class CheckEnvironment(ImmutableSandboxedEnvironment):
    """The transformers sandbox, plus refusal of huge values before they are built."""

    intercepted_binops = frozenset({"*", "**", "+"})

    def __init__(self, now: datetime = DEFAULT_NOW, max_value_items: int = DEFAULT_MAX_VALUE_ITEMS):
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[GenerationExtension, jinja2.ext.loopcontrols],
            # No constant folding at compile time. Folding rewrites the tree in place, so the
            # tree kept for the analyses would have to be copied first (a fifth of a compile),
            # and the fold itself is another quarter. In the sandbox it folds only literals and
            # operators on literals, which evaluate to the same values at render time:
            # tests/checks/test_rendering.py compares every render with transformers'.
            optimized=False,
        )
        self.now = now
        self.max_value_items = max_value_items
        self.filters["tojson"] = self._tojson
        # By id: values the caller froze (`freeze`), and their JSON per argument set.
        self._frozen: dict[int, tuple[Any, dict[tuple[Any, ...], str]]] = {}
        self.globals["raise_exception"] = _raise_exception
        # Reads self.now at call time, so one environment serves checks pinned to different clocks.
        self.globals["strftime_now"] = lambda fmt: self.now.strftime(fmt)
        self.globals["dict"] = TemplateDict()
        self.globals["namespace"] = TemplateNamespace

    def freeze(self, value: Any) -> None:
        """The caller promises that `value`, and every list and dict in it, never changes: its
        `tojson` is then written once per set of arguments. The engine's tool list goes into
        most prompts of a session with tools (2.5% of a check was dumping it again); the
        immutable sandbox keeps templates from changing it. Frozen values are kept alive, so
        their ids are never reused."""
        if len(self._frozen) > 4096:
            self._frozen.clear()  # only a cache: what was frozen before is dumped again
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, dict | list) and id(item) not in self._frozen:
                self._frozen[id(item)] = (item, {})
                stack.extend(item.values() if isinstance(item, dict) else item)

    def _tojson(
        self,
        x: Any,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        """transformers' `tojson`: key order kept, no HTML escaping; frozen values from cache."""

        def dump() -> str:
            return json.dumps(
                x,
                ensure_ascii=ensure_ascii,
                indent=indent,
                separators=separators,
                sort_keys=sort_keys,
            )

        entry = self._frozen.get(id(x))
        if entry is None or entry[0] is not x:
            return dump()
        try:
            seps = None if separators is None else tuple(separators)
            key = (ensure_ascii, indent, seps, sort_keys)
            text = entry[1].get(key)
        except TypeError:  # an unhashable argument: json.dumps judges it
            return dump()
        if text is None:
            text = entry[1][key] = dump()
        return text

    def getattr(self, obj: Any, attribute: str) -> Any:
        """`message.role` on a plain dict without the failed attribute lookup first.

        Jinja tries `getattr(obj, name)`, and on AttributeError the item. A plain dict has no
        attributes but its class's, so for any other name the answer is the item (or
        undefined), exactly as Jinja gives it, minus an exception per access: templates read
        `message.role` and `message.content` for every message of every render. Every other
        object, and the dict's own attributes (`items`, `__class__`), go through the sandbox's
        checks as before."""
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def make_globals(self, d: MutableMapping[str, Any] | None) -> MutableMapping[str, Any]:
        """A plain dict, not Jinja's ChainMap over the environment's globals: every render
        copies a template's globals into its context, and iterating a ChainMap's keys in Python
        cost 3% of a check. The globals are all set above, before any template is compiled."""
        return {**self.globals, **(d or {})}

    def call_binop(
        self, context: jinja2.runtime.Context, operator_: str, left: Any, right: Any
    ) -> Any:
        limit = self.max_value_items
        if operator_ == "+" and type(left) is str and type(right) is str:
            # The common case (markers joined to roles and contents), checked without the
            # general path's calls: a template's `+` runs for nearly every chunk it writes.
            if len(left) + len(right) > limit:
                raise RenderLimitError(
                    f"template tried to build a value of {len(left) + len(right)} items with "
                    f"'+' (limit {limit})"
                )
            return left + right
        if operator_ == "*":
            for seq, count in ((left, right), (right, left)):
                size = _sized(seq)
                if size is not None and isinstance(count, int) and size * count > limit:
                    raise RenderLimitError(
                        f"template tried to build a value of {size * count} items with '*' "
                        f"(limit {limit})"
                    )
            return operator.mul(left, right)
        if operator_ == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                bits = right * math.log2(abs(left))
                if bits > 8 * limit:
                    raise RenderLimitError(f"template tried to compute a {int(bits)}-bit number")
            return operator.pow(left, right)
        left_size, right_size = _sized(left), _sized(right)
        if left_size is not None and right_size is not None and left_size + right_size > limit:
            raise RenderLimitError(
                f"template tried to build a value of {left_size + right_size} items with '+' "
                f"(limit {limit})"
            )
        return operator.add(left, right)


def compile_template(environment: CheckEnvironment, text: str) -> jinja2.Template:
    """Compile template text; raises jinja2.TemplateSyntaxError on bad syntax."""
    return environment.from_string(text)


_RESOLVED_NAME = re.compile(r"resolve\('([^']+)'\)")


@dataclass(frozen=True)
class CompiledTemplate:
    template: jinja2.Template
    ast: jinja2.nodes.Template
    # Names the compiled code looks up in the context: what jinja2.meta would report as
    # undeclared, minus the environment's own globals.
    resolved: frozenset[str]


def compile_parsed(environment: CheckEnvironment, text: str) -> CompiledTemplate:
    """Parse and generate code once: the template, its AST and the names it reads all come
    from that one pass (jinja2.meta would run the code generator a second time).

    The environment does not optimize, so the code generator leaves the tree as written (the
    optimizer would fold `['high', 'low']` into one Const in place) and the analyses
    (variants, findings) read the same tree.
    """
    assert not environment.optimized, "the optimizer would rewrite the analysed tree"
    ast = environment.parse(text)
    source = environment.compile(ast, raw=True)
    code = compile(source, "<template>", "exec")
    globals_ = environment.make_globals(None)
    template = environment.template_class.from_code(environment, code, globals_, None)
    return CompiledTemplate(template, ast, frozenset(_RESOLVED_NAME.findall(source)))


class TemplateCache:
    """An LRU of compiled templates keyed by sha256, so each compiles once per process."""

    def __init__(self, environment: CheckEnvironment, size: int = 256) -> None:
        self.environment = environment
        self.size = size
        self.compilations = 0
        self._templates: OrderedDict[str, CompiledTemplate] = OrderedDict()

    def get(self, sha256: str, text: str) -> jinja2.Template:
        return self.get_parsed(sha256, text).template

    def get_parsed(self, sha256: str, text: str) -> CompiledTemplate:
        """The compiled template and its AST; raises jinja2.TemplateSyntaxError on bad syntax."""
        entry = self._templates.get(sha256)
        if entry is not None:
            self._templates.move_to_end(sha256)
            return entry
        entry = compile_parsed(self.environment, text)
        self.compilations += 1
        if self.size > 0:  # size 0 is the naive baseline: compile on every use
            self._templates[sha256] = entry
            if len(self._templates) > self.size:
                self._templates.popitem(last=False)
        return entry


def plain_data(value: Any) -> Any:
    """Rebuild a value out of plain JSON types, as transformers' `_plain_template_data` does."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item) for item in value)
    return f"<{type(value).__name__}>"


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop None-valued keys and alias reasoning fields, as transformers 5.x does."""
    normalized = []
    for message in messages:
        plain = plain_data({k: v for k, v in message.items() if v is not None})
        reasoning = next(
            (plain[key] for key in REASONING_FIELDS if plain.get(key) is not None), None
        )
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        normalized.append(plain)
    return normalized


def template_context(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    special_tokens: Mapping[str, str],
    kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """The variables a template sees: special tokens first, then kwargs, which win over them."""
    extra = plain_data({**special_tokens, **kwargs})
    return {
        "messages": messages,
        "tools": plain_data(tools),
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        **extra,
    }


def render(
    template: jinja2.Template,
    context: dict[str, Any],
    max_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> str:
    """Render a prepared context (see `template_context`) within the output limit.

    The template's render function is run directly, not through `Template.generate`: on an
    error that would rewrite the traceback into template frames (a fresh code object per
    frame, 2.5% of a check, mostly for templates refusing a conversation). `template_line`
    maps the generated code's lines through the debug info instead, to the same lines."""
    parts = []
    produced = 0
    for chunk in template.root_render_func(template.new_context(context)):
        produced += len(chunk)
        if produced > max_chars:
            raise RenderLimitError(f"output over {max_chars // (1024 * 1024)} MiB")
        parts.append(chunk)
    return "".join(parts)
