"""Fast lookups in a parsed template: every node walked once, then filtered by type on demand.

The static analyses (variants, findings) ask the same AST for its `If`, `Compare`, `Call`, …
nodes dozens of times; `Node.find_all` walks the whole tree each time.
"""

from __future__ import annotations

from typing import Any

from jinja2 import nodes

_INDEX: dict[int, tuple[nodes.Template, dict[Any, list[Any]]]] = {}


def find(ast: nodes.Template, kinds: type[nodes.Node] | tuple[type[nodes.Node], ...]) -> list[Any]:
    """The nodes of `ast` of the given type(s), in `find_all` order (depth first)."""
    entry = _INDEX.get(id(ast))
    if entry is None or entry[0] is not ast:
        if len(_INDEX) > 256:
            _INDEX.clear()
        entry = _INDEX[id(ast)] = (ast, {None: list(ast.find_all(nodes.Node))})
    by_kind = entry[1]
    found = by_kind.get(kinds)
    if found is None:
        found = by_kind[kinds] = [node for node in by_kind[None] if isinstance(node, kinds)]
    return found
