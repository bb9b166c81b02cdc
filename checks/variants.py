"""The settings a template is checked under: named template × the thinking kwargs it actually reads.

Only what the template reads is varied (found with `jinja2.meta` on its AST): a template that never
reads `enable_thinking` gets one variant, not three.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jinja2.meta
from jinja2 import nodes

from checks.sources import SPECIAL_TOKEN_NAMES

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


def assigned_names(ast: nodes.Template) -> set[str]:
    names: set[str] = set()
    statements: list[Any] = list(ast.find_all((nodes.Assign, nodes.AssignBlock, nodes.For)))
    for node in statements:
        names |= {n.name for n in node.target.find_all(nodes.Name)}
        if isinstance(node.target, nodes.Name):
            names.add(node.target.name)
    for macro in ast.find_all(nodes.Macro):
        names.add(macro.name)
        names |= {arg.name for arg in macro.args}
    return names


def kwargs_read(ast: nodes.Template) -> list[str]:
    """Variables the template reads that the caller may pass as chat_template_kwargs."""
    undeclared = jinja2.meta.find_undeclared_variables(ast)
    return sorted(undeclared - PROVIDED_NAMES - assigned_names(ast))


def _compared_values(ast: nodes.Template, name: str) -> list[Any]:
    values: list[Any] = []
    for compare in ast.find_all(nodes.Compare):
        if name not in {n.name for n in compare.find_all(nodes.Name)}:
            continue
        for const in compare.find_all(nodes.Const):
            value = const.value
            plain = isinstance(value, str | int | float) and not isinstance(value, bool)
            if plain and value not in values:
                values.append(value)
    return values[:3]


def kwarg_values(ast: nodes.Template, name: str) -> list[Any]:
    """Meaningful values of a kwarg, unset first: compared constants, else the two booleans."""
    if name == "enable_thinking":
        return [UNSET, False, True]
    return [UNSET, *(_compared_values(ast, name) or [True, False])]


_THINK_TAG = re.compile(r"<[^<>\s]{0,24}think[^<>\s]{0,24}>", re.IGNORECASE)
_REASONING_FIELDS = {"reasoning_content", "thinking", "reasoning"}


def writes_reasoning(ast: nodes.Template) -> bool:
    """Does the template know about reasoning: reads a reasoning field or writes a think tag?"""
    if reads_field(ast, _REASONING_FIELDS):
        return True
    literals = [n.data for n in ast.find_all(nodes.TemplateData)]
    literals += [n.value for n in ast.find_all(nodes.Const) if isinstance(n.value, str)]
    return any(_THINK_TAG.search(text) for text in literals)


def reads_field(ast: nodes.Template, names: set[str]) -> bool:
    """Does the template read one of these keys from some value (`x.key` or `x['key']`)?"""
    accesses: list[Any] = list(ast.find_all((nodes.Getattr, nodes.Getitem)))
    for node in accesses:
        key = node.attr if isinstance(node, nodes.Getattr) else getattr(node.arg, "value", None)
        if key in names and not (isinstance(node.node, nodes.Name) and node.node.name == "loop"):
            return True
    return False


def thinking_kwargs(ast: nodes.Template) -> list[str]:
    """The kwargs that switch or shape reasoning, enable_thinking first when read."""
    names = [name for name in kwargs_read(ast) if _THINKING_KWARG.search(name)]
    return sorted(names, key=lambda name: name != "enable_thinking")


def plan_variants(asts: dict[str, nodes.Template]) -> list[Variant]:
    """Every named template × enable_thinking × each other thinking kwarg, one at a time."""
    variants: list[Variant] = []
    for template_name, ast in asts.items():
        thinking = thinking_kwargs(ast)
        main = thinking[0] if thinking and thinking[0] == "enable_thinking" else None
        base_values = kwarg_values(ast, main) if main else [UNSET]
        others = [name for name in thinking if name != main]
        combos: list[dict[str, Any]] = [{}]
        for other in others:
            combos += [{other: value} for value in kwarg_values(ast, other) if value is not UNSET]
        for combo in combos:
            for base in base_values:
                kwargs = dict(combo)
                if main and base is not UNSET:
                    kwargs = {main: base, **kwargs}
                variant = Variant(template_name, tuple(kwargs.items()))
                if variant not in variants:
                    variants.append(variant)
    return variants
