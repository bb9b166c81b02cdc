"""Fast lookups in a parsed template: every node walked once, then filtered by type on demand.

The static analyses (variants, findings) ask the same AST, and its statements and expressions,
for their `If`, `Compare`, `Call`, … nodes hundreds of times. `Node.find_all` walks the subtree
each time through a chain of nested generators (each node passes through one per level). Here a
template is walked once into a flat pre-order list in which every node's descendants are one
slice; `find` filters that slice (and remembers the answer for the whole template).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jinja2 import nodes

Kinds = type[nodes.Node] | tuple[type[nodes.Node], ...]


@dataclass
class _Index:
    root: nodes.Template
    order: list[nodes.Node]  # pre-order, `find_all`'s order
    ends: list[int]  # ends[i]: one past the last descendant of order[i]
    found: dict[tuple[int, Any], list[Any]] = field(default_factory=dict)


# By the id of every node of an indexed template: (its template's index, its position). The
# index holds the template, so no id is reused while its entries live.
_POSITIONS: dict[int, tuple[_Index, int]] = {}
_ROOTS: dict[int, _Index] = {}
# The analyses ask one check's templates again and again; a worker that kept the indexes of
# hundreds of templates paid for them in every garbage collection. Five passes over the corpus
# in one process went from 2.31 to 2.66 s of CPU each with 256 kept here (and 512 ASTs in
# `variants`); with 8 and 16 they stay at 2.16 to 2.22 s.
_MAX_TEMPLATES = 8


def _index(ast: nodes.Template) -> _Index:
    index = _ROOTS.get(id(ast))
    if index is not None and index.root is ast:
        return index
    if len(_ROOTS) >= _MAX_TEMPLATES:
        _ROOTS.clear()
        _POSITIONS.clear()
    order: list[nodes.Node] = []
    ends: list[int] = []

    def walk(node: nodes.Node) -> None:
        position = len(order)
        order.append(node)
        ends.append(0)
        for child in node.iter_child_nodes():
            walk(child)
        ends[position] = len(order)

    walk(ast)
    index = _ROOTS[id(ast)] = _Index(ast, order, ends)
    for position, node in enumerate(order):
        _POSITIONS[id(node)] = (index, position)
    return index


def find(node: nodes.Node, kinds: Kinds) -> list[Any]:
    """The descendants of `node` of the given type(s), in `find_all` order (depth first).

    A template (`nodes.Template`) is indexed on first use; a node inside an indexed template is
    answered from that index, any other node by `find_all`."""
    if isinstance(node, nodes.Template):
        index = _index(node)
        position = 0
    else:
        entry = _POSITIONS.get(id(node))
        if entry is None or entry[0].order[entry[1]] is not node:
            return list(node.find_all(kinds))
        index, position = entry
    key = (position, kinds)
    found = index.found.get(key)
    if found is None:
        found = index.found[key] = [
            n for n in index.order[position + 1 : index.ends[position]] if isinstance(n, kinds)
        ]
    return found
