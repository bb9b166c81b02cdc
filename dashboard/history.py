"""A model's template history: changes with the verdict before and after, and version diffs."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from django.db.models import OuterRef, QuerySet, Subquery

from checks.attribution import template_lines
from registry.models import (
    CheckRun,
    CheckStatus,
    HubModel,
    NamedTemplate,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
)


def _verdict_of(field: str) -> Subquery:
    newest = CheckRun.objects.filter(
        template_version=OuterRef(field), status=CheckStatus.DONE
    ).order_by("-finished_at", "-id")
    return Subquery(newest.values("verdict")[:1])


def timeline(model: HubModel, limit: int = 50) -> QuerySet[TemplateChange]:
    """The newest changes first, each annotated with the verdict of both versions (one query)."""
    return (
        model.changes.select_related("old_version", "new_version")
        .defer("old_version__text", "new_version__text")
        .annotate(old_verdict=_verdict_of("old_version"), new_verdict=_verdict_of("new_version"))
        .order_by("-committed_at", "-id")[:limit]
    )


def named_templates(snapshot: TemplateSnapshot) -> list[NamedTemplate]:
    """The snapshot's named templates (`default`, `tool_use`, …) with each one's verdict."""
    return list(
        snapshot.named_templates.select_related("version")
        .defer("version__text")
        .annotate(verdict=_verdict_of("version"))
        .order_by("name")
    )


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "same", "add", "del", "hunk"
    old: int | None
    new: int | None
    text: str


#: Lines each side of the part two versions do not share, past which the diff lets difflib
#: treat lines repeated all over as junk (see `line_diff`).
EXACT_DIFF_LINES = 300


def line_diff(old: TemplateVersion, new: TemplateVersion, context: int = 3) -> list[DiffLine]:
    """A unified diff of two template texts, line-numbered on both sides.

    difflib's matcher, told that no line is junk, takes time that grows with the cube of the
    lines repeated everywhere (`{%- endif %}`): two 1,200-line templates took 8.4 s, 2,000
    lines 35 s, on a page anyone can open. The lines both versions start and end with are
    set apart first (an edit is most often in one place); what is left is matched exactly
    up to `EXACT_DIFF_LINES` a side (0.13 s at worst), and past that with difflib's own
    heuristic, under which a line on more than 1% of them starts no match (0.05 s for
    60,000 lines), so a diff that long may show a block replaced that it could have aligned."""
    a, b = _lines(old.text), _lines(new.text)
    rows: list[DiffLine] = []
    matcher = _Matcher(a, b)
    for group in matcher.get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        rows.append(
            DiffLine(
                "hunk",
                None,
                None,
                f"@@ -{first[1] + 1},{last[2] - first[1]} +{first[3] + 1},{last[4] - first[3]} @@",
            )
        )
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows += [
                    DiffLine("same", i + 1, j + 1, a[i])
                    for i, j in zip(range(i1, i2), range(j1, j2), strict=True)
                ]
                continue
            rows += [DiffLine("del", i + 1, None, a[i]) for i in range(i1, i2)]
            rows += [DiffLine("add", None, j + 1, b[j]) for j in range(j1, j2)]
    return rows


def _lines(text: str) -> list[str]:
    """Numbered as the template page and the engine number them (`template_lines`), without
    the empty line after a final line break."""
    lines = template_lines(text)
    return lines[:-1] if len(lines) > 1 and lines[-1] == "" else lines


class _Matcher(difflib.SequenceMatcher[str]):
    """difflib's matcher of two lists of lines that matches only what lies between the lines
    both start and end with (see `line_diff`)."""

    def __init__(self, a: list[str], b: list[str]) -> None:
        super().__init__(None, a, b, autojunk=False)
        self._lines = (a, b)
        self._blocks: list[difflib.Match] | None = None

    def get_matching_blocks(self) -> list[difflib.Match]:
        if self._blocks is None:
            self._blocks = _matching_blocks(*self._lines)
        return self._blocks


def _matching_blocks(a: list[str], b: list[str]) -> list[difflib.Match]:
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    middle_a, middle_b = a[start : len(a) - end], b[start : len(b) - end]
    exact = max(len(middle_a), len(middle_b)) <= EXACT_DIFF_LINES
    inner = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=not exact)
    found = [difflib.Match(0, 0, start)]
    found += [difflib.Match(i + start, j + start, n) for i, j, n in inner.get_matching_blocks()]
    found.append(difflib.Match(len(a) - end, len(b) - end, end))
    blocks: list[difflib.Match] = []
    for block in found:
        if not block.size:
            continue
        if blocks and (blocks[-1].a + blocks[-1].size, blocks[-1].b + blocks[-1].size) == (
            block.a,
            block.b,
        ):
            last = blocks.pop()
            block = difflib.Match(last.a, last.b, last.size + block.size)
        blocks.append(block)
    blocks.append(difflib.Match(len(a), len(b), 0))
    return blocks
