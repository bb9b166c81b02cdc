"""The settings a template is checked under: named template × the thinking kwargs it actually reads.

Only what the template reads is varied (found with `jinja2.meta` on its AST): a template that never
reads `enable_thinking` gets one variant, not three.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

import jinja2.meta
from jinja2 import nodes

from checks.sources import SPECIAL_TOKEN_NAMES
from checks.template_ast import find

# Names the caller (transformers, a serving engine) provides; never treated as user kwargs.
PROVIDED_NAMES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "raise_exception",
        "strftime_now",
        "namespace",
        "dict",
        "range",
        "lipsum",
        "cycler",
        "joiner",
        "loop",
        "additional_special_tokens",
        *SPECIAL_TOKEN_NAMES,
    }
)
# Kwargs that switch or shape reasoning: these change what is cached, so each is varied.
_THINKING_KWARG = re.compile(r"think|reason", re.IGNORECASE)
UNSET = object()


@dataclass(frozen=True)
class Variant:
    template_name: str
    kwargs: tuple[tuple[str, Any], ...]

    @property
    def kwargs_dict(self) -> dict[str, Any]:
        return dict(self.kwargs)

    @property
    def label(self) -> str:
        settings = ", ".join(f"{k}={json.dumps(v)}" for k, v in self.kwargs) or "no kwargs"
        return settings if self.template_name == "default" else f"{self.template_name}: {settings}"


def _assigned(ast: nodes.Template) -> set[str]:
    targets: list[Any] = list(find(ast, (nodes.Assign, nodes.AssignBlock, nodes.For)))
    names = {n.name for node in targets for n in find(node.target, nodes.Name)}
    names |= {node.target.name for node in targets if isinstance(node.target, nodes.Name)}
    for macro in find(ast, nodes.Macro):
        names |= {macro.name, *(arg.name for arg in macro.args)}
    return names


def _expected_from_caller(ast: nodes.Template) -> set[str]:
    """Names tested with `is defined` or given a `default`: the template expects a caller value."""
    names: set[str] = set()
    for test in find(ast, nodes.Test):
        if test.name in ("defined", "undefined") and isinstance(test.node, nodes.Name):
            names.add(test.node.name)
    for filter_ in find(ast, nodes.Filter):
        if filter_.name in ("default", "d") and isinstance(filter_.node, nodes.Name):
            names.add(filter_.node.name)
    return names


# find_undeclared_variables runs Jinja's code generator; the engine already ran it to compile,
# so it hands the names over (`remember_resolved`) and they are reused here.
# Per AST, for the checks at hand only: a few templates, not hundreds kept alive for every
# garbage collection to walk (see template_ast._MAX_TEMPLATES).
_CACHED_ASTS = 16
_READ_CACHE: dict[int, tuple[nodes.Template, list[str]]] = {}
_RESOLVED: dict[int, tuple[nodes.Template, frozenset[str]]] = {}


def remember_resolved(ast: nodes.Template, names: frozenset[str]) -> None:
    """Record the names the compiled code of `ast` resolves from its context."""
    if len(_RESOLVED) > _CACHED_ASTS:
        _RESOLVED.clear()
    _RESOLVED[id(ast)] = (ast, names)


def kwargs_read(ast: nodes.Template) -> list[str]:
    """Variables the template reads that the caller may pass as chat_template_kwargs.

    Jinja reports variables set inside a block as undeclared too; those count only when the
    template also tests them with `is defined` or `default` (a value from the caller is expected).
    """
    cached = _READ_CACHE.get(id(ast))
    if cached is not None and cached[0] is ast:
        return cached[1]
    known = _RESOLVED.get(id(ast))
    if known is not None and known[0] is ast:
        undeclared = set(known[1]) - PROVIDED_NAMES
    else:
        # jinja2.meta runs the code generator, whose optimizer folds constants in the tree it
        # walks (`['high', 'low']` becomes one Const): give it a copy, keep `ast` as written.
        copied = copy.deepcopy(ast, {id(ast.environment): ast.environment})
        undeclared = jinja2.meta.find_undeclared_variables(copied) - PROVIDED_NAMES
    internal = _assigned(ast) - _expected_from_caller(ast)
    read = sorted(undeclared - internal)
    if len(_READ_CACHE) > _CACHED_ASTS:
        _READ_CACHE.clear()
    _READ_CACHE[id(ast)] = (ast, read)
    return read


def _aliases(ast: nodes.Template, name: str) -> set[str]:
    """The kwarg's name and the variables set from it (`{% set effort = kwarg|default(...) %}`)."""
    aliases = {name}
    for assign in find(ast, nodes.Assign):
        mentioned = {n.name for n in find(assign.node, nodes.Name)}
        if isinstance(assign.node, nodes.Name):
            mentioned.add(assign.node.name)
        if mentioned & aliases:
            aliases |= {n.name for n in find(assign.target, nodes.Name)}
            if isinstance(assign.target, nodes.Name):
                aliases.add(assign.target.name)
            if isinstance(assign.target, nodes.NSRef):
                aliases.add(assign.target.attr)
    return aliases


def _compared_values(ast: nodes.Template, name: str) -> list[Any]:
    """Constants the kwarg (or an alias of it) is compared with: its meaningful values."""
    aliases = _aliases(ast, name)
    values: list[Any] = []
    for compare in find(ast, nodes.Compare):
        mentioned = {n.name for n in find(compare, nodes.Name)}
        mentioned |= {n.attr for n in find(compare, nodes.Getattr)}
        if not mentioned & aliases:
            continue
        for const in find(compare, nodes.Const):
            value = const.value
            plain = isinstance(value, str | int | float) and not isinstance(value, bool)
            if plain and value not in values:
                values.append(value)
    return values[:3]


def _used_as_boolean(ast: nodes.Template, aliases: set[str]) -> bool:
    def is_alias(node: nodes.Node) -> bool:
        return isinstance(node, nodes.Name) and node.name in aliases

    conditions: list[Any] = [*find(ast, nodes.If), *find(ast, nodes.CondExpr)]
    if any(c.test is not None and is_alias(c.test) for c in conditions):
        return True
    logic: list[Any] = list(find(ast, (nodes.And, nodes.Or, nodes.Not)))
    for node in logic:
        operands = [node.node] if isinstance(node, nodes.Not) else [node.left, node.right]
        if any(is_alias(operand) for operand in operands):
            return True
    return any(
        test.name in ("true", "false", "boolean") and is_alias(test.node)
        for test in find(ast, nodes.Test)
    )


def kwarg_values(ast: nodes.Template, name: str) -> list[Any]:
    """Meaningful values of a kwarg, unset first: the constants it is compared with, else the two
    booleans when it is used as a condition, else none (a free-form value is left unset)."""
    if name == "enable_thinking":
        return [UNSET, False, True]
    compared = _compared_values(ast, name)
    if compared:
        return [UNSET, *compared]
    return [UNSET, True, False] if _used_as_boolean(ast, _aliases(ast, name)) else [UNSET]


_REASONING_FIELDS = {"reasoning_content", "thinking", "reasoning"}


def reads_reasoning(ast: nodes.Template) -> bool:
    """Does the template write reasoning back into history? Only then is it responsible for it."""
    return reads_field(ast, _REASONING_FIELDS)


def reads_thinking_chunks(ast: nodes.Template) -> bool:
    """Does the template compare something with 'thinking' (a content chunk's type, Mistral
    style: `{% if chunk['type'] == 'thinking' %}`)? Only then can a client send chunks."""
    for compare in find(ast, nodes.Compare):
        if not all(op.op in ("eq", "ne") for op in compare.ops):
            continue
        operands = [compare.expr, *(op.expr for op in compare.ops)]
        constant = any(isinstance(o, nodes.Const) and o.value == "thinking" for o in operands)
        typed = any(
            (isinstance(o, nodes.Getattr) and o.attr == "type")
            or (isinstance(o, nodes.Getitem) and getattr(o.arg, "value", None) == "type")
            for o in operands
        )
        if constant and typed:
            return True
    return False


def reads_field(ast: nodes.Template, names: set[str]) -> bool:
    """Does the template read one of these keys from some value (`x.key` or `x['key']`)?"""
    accesses: list[Any] = list(find(ast, (nodes.Getattr, nodes.Getitem)))
    for node in accesses:
        key = node.attr if isinstance(node, nodes.Getattr) else getattr(node.arg, "value", None)
        if key in names and not (isinstance(node.node, nodes.Name) and node.node.name == "loop"):
            return True
    for call in find(ast, nodes.Call):
        # message.get('reasoning_content')
        getter = isinstance(call.node, nodes.Getattr) and call.node.attr == "get"
        if getter and call.args and getattr(call.args[0], "value", None) in names:
            return True
    return False


def thinking_kwargs(ast: nodes.Template) -> list[str]:
    """The kwargs that switch or shape reasoning, enable_thinking first when read."""
    names = [name for name in kwargs_read(ast) if _THINKING_KWARG.search(name)]
    return sorted(names, key=lambda name: name != "enable_thinking")


# Enough for every template seen so far (the most needs 10); bounds the work a stranger can ask for.
MAX_VARIANTS = 16


def plan_variants(asts: dict[str, nodes.Template]) -> list[Variant]:
    """enable_thinking (unset, false, true), plus each other thinking kwarg one at a time.

    A boolean kwarg (preserve_thinking, …) is also tried with thinking on, where it matters; a
    valued one (reasoning_effort, …) only with enable_thinking unset, to keep the count small.
    Named templates follow transformers: `default` stands for its automatic choice (`tool_use`
    when tools are passed), any other name is checked on its own. Without a template named
    `default` that choice is still checked (it raises for a request without tools), and
    `tool_use` on its own too.
    """
    groups: dict[str, list[nodes.Template]] = {}
    if "default" not in asts:
        groups["default"] = [asts["tool_use"]] if "tool_use" in asts else []
    for name, ast in asts.items():
        auto = "default" in asts and name in ("default", "tool_use")
        groups.setdefault("default" if auto else name, []).append(ast)
    variants: list[Variant] = []

    def add(template_name: str, kwargs: dict[str, Any]) -> None:
        variant = Variant(template_name, tuple(kwargs.items()))
        if variant not in variants:
            variants.append(variant)

    for template_name, group in groups.items():
        values: dict[str, list[Any]] = {}
        for ast in group:
            for name in thinking_kwargs(ast):
                known = values.setdefault(name, [])
                known += [v for v in kwarg_values(ast, name) if v not in known]
        main = "enable_thinking" if "enable_thinking" in values else None
        for base in values.get("enable_thinking", [UNSET]):
            add(template_name, {} if main is None or base is UNSET else {main: base})
        for other, other_values in values.items():
            if other == main:
                continue
            for value in other_values:
                if value is UNSET:
                    continue
                add(template_name, {other: value})
                if main and isinstance(value, bool):
                    add(template_name, {main: True, other: value})
    # Primary settings (none, or enable_thinking alone) first, so a cut keeps them.
    variants.sort(key=lambda v: not set(dict(v.kwargs)) <= {"enable_thinking"})
    return variants[:MAX_VARIANTS]
