"""A model's template history: changes with the verdict before and after, and version diffs."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from django.db.models import OuterRef, QuerySet, Subquery

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


def line_diff(old: TemplateVersion, new: TemplateVersion, context: int = 3) -> list[DiffLine]:
    """A unified diff of two template texts, line-numbered on both sides."""
    a, b = old.text.splitlines(), new.text.splitlines()
    rows: list[DiffLine] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
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
