"""`template_ast.find` answers exactly what `Node.find_all` would, for every node of a template."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2 import nodes

from checks.rendering import CheckEnvironment
from checks.template_ast import find
from tests.checks.conftest import corpus_cases, corpus_source

KINDS: list[Any] = [
    nodes.Node,
    nodes.If,
    nodes.Name,
    (nodes.Name, nodes.NSRef, nodes.Getattr),
    nodes.Const,
]


@pytest.mark.parametrize("entry", corpus_cases(step=3))
def test_every_node_of_a_corpus_template_finds_what_find_all_finds(entry: dict[str, Any]) -> None:
    environment = CheckEnvironment()
    for text in corpus_source(entry).templates.values():
        ast = environment.parse(text)
        every = [ast, *ast.find_all(nodes.Node)]
        for node in every:
            for kinds in KINDS:
                assert find(node, kinds) == list(node.find_all(kinds))


def test_a_node_outside_any_indexed_template_is_walked_directly() -> None:
    ast = CheckEnvironment().parse("{% if a %}{{ b }}{% endif %}")
    branch = next(iter(ast.find_all(nodes.If)))  # never indexed: `find` was not asked for `ast`
    assert [n.name for n in find(branch, nodes.Name)] == ["a", "b"]
    assert [n.name for n in find(ast, nodes.Name)] == ["a", "b"]
    assert [n.name for n in find(branch, nodes.Name)] == ["a", "b"]  # now from the index


def test_two_parses_of_one_text_do_not_share_answers() -> None:
    environment = CheckEnvironment()
    first, second = (environment.parse("{{ a }}{{ b }}") for _ in range(2))
    pairs = list(zip(find(first, nodes.Name), find(second, nodes.Name), strict=True))
    assert len(pairs) == 2 and all(a is not b for a, b in pairs)
