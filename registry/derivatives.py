"""Quantizations, conversions and fine-tunes, linked to their base through `base_model` (the model
card's metadata, read by the sync), and whether they still carry the base's template.

People serve `mlx-community/Qwen3-8B-4bit` or a GGUF, not `Qwen/Qwen3-8B`; a conversion copies
the base's template at some commit and often keeps it after the base fixes it. `drift` says which
of three it is: the base's current template, an older one of the base's (which, when, and the
verdict then), or an edited one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models.functions import Upper

from .models import Drift as DriftKind
from .models import EventKind, HubModel, ModelEvent, TemplateChange, Verdict
from .signals import events_recorded

#: How far up a chain of bases we follow (a fine-tune of a quantization of a base, …).
MAX_DEPTH = 5
#: How many derivatives a base page lists (the most downloaded first).
MAX_LISTED = 50

SAME, OLDER, EDITED, UNKNOWN = "same", "older", "edited", "unknown"


def bases(model: HubModel) -> list[HubModel]:
    """The tracked chain above `model`, nearest first; stops at an untracked base or a loop."""
    chain: list[HubModel] = []
    seen = {model.repo_id.lower()}
    current = model
    while current.base_model and len(chain) < MAX_DEPTH:
        name = current.base_model.lower()
        if name in seen:
            break  # a card that names itself, or a loop through another repo's card
        base = (
            HubModel.objects.select_related("current_snapshot__default_template")
            .filter(repo_id__iexact=current.base_model)
            .first()
        )
        if base is None:
            break
        chain.append(base)
        seen.add(name)
        current = base
    return chain


def derivatives(model: HubModel) -> list[HubModel]:
    """Tracked models whose card names `model` as their base, most downloaded first."""
    return list(
        HubModel.objects.select_related("current_snapshot__default_template")
        .filter(base_model__iexact=model.repo_id)
        .exclude(pk=model.pk)
        .order_by("-downloads", "repo_id")[:MAX_LISTED]
    )


@dataclass(frozen=True)
class Drift:
    """How a derivative's template relates to its base's."""

    kind: str  # SAME, OLDER, EDITED or UNKNOWN
    base: HubModel
    #: For OLDER: the base's change that introduced the template the derivative still carries.
    since: TemplateChange | None = None
    #: For OLDER: when the base replaced it.
    replaced_at: datetime | None = None

    @property
    def sentence(self) -> str:
        name = self.base.repo_id
        if self.kind == SAME:
            return f"Its chat template is byte-identical to {name}'s current one."
        if self.kind == OLDER and self.since is not None:
            when = f" (until {self.replaced_at:%Y-%m-%d})" if self.replaced_at else ""
            return (
                f"Its chat template is an older one of {name}'s: the one from commit "
                f"{self.since.commit_sha[:12]}{when}. {name} has changed it since."
            )
        if self.kind == EDITED:
            return f"Its chat template differs from every version of {name}'s we know."
        return f"We cannot compare its chat template with {name}'s yet."


def drift(model: HubModel, base: HubModel) -> Drift:
    """Compare `model`'s current default template with `base`'s current one and its history."""
    return drifts(base, [model])[0]


def drifts(base: HubModel, models: list[HubModel]) -> list[Drift]:
    """`drift` of each of `models` against `base`, reading the base's history once."""
    if not models:
        return []
    theirs = base.current_snapshot.default_template_id if base.current_snapshot else None
    history = list(base.changes.order_by("committed_at", "id"))
    found = []
    for model in models:
        mine = model.current_snapshot.default_template_id if model.current_snapshot else None
        if mine is None or theirs is None:
            found.append(Drift(UNKNOWN, base))
        elif mine == theirs:
            found.append(Drift(SAME, base))
        else:
            found.append(_older_or_edited(base, mine, history))
    return found


def _older_or_edited(base: HubModel, version_id: int, history: list[TemplateChange]) -> Drift:
    # The latest time the base took this template: a template can come back after a revert.
    for index in range(len(history) - 1, -1, -1):
        if history[index].new_version_id == version_id:
            later = history[index + 1] if index + 1 < len(history) else None
            return Drift(OLDER, base, history[index], later.committed_at if later else None)
    return Drift(EDITED, base)


def refresh_drift(model: HubModel) -> list[int]:
    """`refresh_drift_many` of one model."""
    return refresh_drift_many([model])


def refresh_drift_many(models: Sequence[HubModel]) -> list[int]:
    """Store the drift of each of `models` against its nearest tracked base, and of every
    tracked derivative of each against it (the catalog filters on it); the ids whose drift
    changed.

    Called when the models' templates were recorded: either side of a pair changing is
    covered, since a derivative's sync refreshes itself and a base's sync refreshes its
    derivatives. The bases of all of them are read in one query, their derivatives in another
    (a batch of first syncs is mostly repos that are neither), and a base's history once."""
    found: dict[int, str] = {}
    nearest = _nearest_bases(models)
    against: dict[int, tuple[HubModel, list[HubModel]]] = {}
    for model in models:
        base = nearest.get(model.pk)
        if base is None:
            found[model.pk] = ""
        else:
            against.setdefault(base.pk, (base, []))[1].append(model)
    for base, group in against.values():
        found |= {m.pk: d.kind for m, d in zip(group, drifts(base, group), strict=True)}
    changed = _store_drift(
        {model.pk: found[model.pk] for model in models if found[model.pk] != model.drift},
        models,
    )
    names = {model.repo_id.upper(): model for model in models}
    below: dict[int, list[HubModel]] = {}
    for derivative in (
        HubModel.objects.select_related("current_snapshot")
        .annotate(base_upper=Upper("base_model"))
        .filter(base_upper__in=list(names))
        .only("pk", "drift", "base_model", "current_snapshot__default_template_id")
    ):
        base = names.get(derivative.base_model.upper())
        if base is not None and derivative.pk != base.pk:
            below.setdefault(base.pk, []).append(derivative)
    moved: dict[int, str] = {}
    for model in models:
        group = below.get(model.pk, [])
        for derivative, drifted in zip(group, drifts(model, group), strict=True):
            if derivative.drift != drifted.kind:
                moved[derivative.pk] = drifted.kind
    return changed + [pk for pk in _store_drift(moved, models) if pk not in changed]


def _nearest_bases(models: Sequence[HubModel]) -> dict[int, HubModel]:
    """The nearest tracked base of each of `models` that names one (`bases(model)[0]`), by
    the model's id, in one query."""
    wanted = {
        model.pk: model.base_model.upper()
        for model in models
        if model.base_model and model.base_model.lower() != model.repo_id.lower()
    }
    if not wanted:
        return {}
    tracked: dict[str, HubModel] = {}
    for base in (
        HubModel.objects.select_related("current_snapshot__default_template")
        .annotate(id_upper=Upper("repo_id"))
        .filter(id_upper__in=set(wanted.values()))
        .order_by("pk")
    ):
        tracked.setdefault(base.repo_id.upper(), base)  # the first, as `bases` takes it
    return {pk: tracked[name] for pk, name in wanted.items() if name in tracked}


def _store_drift(kinds: dict[int, str], models: Sequence[HubModel]) -> list[int]:
    """Write each model's new drift (one update a kind), and on those of `models` in memory."""
    by_kind: dict[str, list[int]] = {}
    for pk, kind in kinds.items():
        by_kind.setdefault(kind, []).append(pk)
    for kind, ids in by_kind.items():
        HubModel.objects.filter(pk__in=ids).update(drift=kind)
    for model in models:
        if model.pk in kinds:
            model.drift = kinds[model.pk]
    return list(kinds)


#: A derivative's verdicts that a base's cache-safe template would fix.
NOT_SAFE = (Verdict.UNSAFE,)


def record_stale_fixes_after_syncs(models: Sequence[HubModel], drifted: list[int]) -> int:
    """`record_stale_fixes` for models whose templates a sync just recorded and the models
    whose drift that moved (`refresh_drift_many`). Without a query when none can qualify: no
    model is cache-safe (a base whose derivatives may lag) or an older copy of its base with a
    verdict a fix would change, and no drift moved. New repos' first syncs are that case."""
    qualifying = [
        model.pk
        for model in models
        if model.verdict == Verdict.SAFE
        or (model.drift == DriftKind.OLDER and model.verdict in NOT_SAFE)
    ]
    if not drifted and not qualifying:
        return 0
    return record_stale_fixes([*qualifying, *drifted])


def record_stale_fixes(model_ids: Iterable[int]) -> int:
    """Events for derivatives that still carry an older template of their base's while the base
    has made its template cache-safe: among `model_ids` and the derivatives of those of them
    that are cache-safe. Once per pair of templates (the event key); returns how many are new.

    Called where verdicts and drift change (registry.verdicts, the sync's record)."""
    ids = list(model_ids)
    if not ids:
        return 0
    safe_bases = list(
        HubModel.objects.filter(pk__in=ids, verdict=Verdict.SAFE).values_list("repo_id", flat=True)
    )
    candidates = HubModel.objects.select_related("current_snapshot__default_template").filter(
        drift=DriftKind.OLDER, verdict__in=NOT_SAFE
    )
    stale = candidates.filter(pk__in=ids)
    if safe_bases:
        below = candidates.annotate(base_upper=Upper("base_model")).filter(
            base_upper__in=[r.upper() for r in safe_bases]
        )
        stale = stale | below
    recorded = 0
    for model in stale.distinct():
        chain = bases(model)
        if not chain or chain[0].verdict != Verdict.SAFE or model.current_snapshot is None:
            continue
        base = chain[0]
        found = drift(model, base)
        if found.kind != OLDER or base.current_snapshot is None:
            continue
        mine = model.current_snapshot.default_template.sha256
        theirs = base.current_snapshot.default_template.sha256
        since = f" from commit {found.since.commit_sha[:12]}" if found.since else ""
        _, created = ModelEvent.objects.get_or_create(
            key=f"base_fixed:{model.pk}:{mine[:16]}:{theirs[:16]}",
            defaults={
                "model_id": model.pk,
                "kind": EventKind.BASE_FIXED,
                "summary": f"{model.repo_id} still carries {base.repo_id}'s template{since}; "
                f"{base.repo_id}'s current template is cache-safe",
                "data": {
                    "base": base.repo_id,
                    "template": mine,
                    "base_template": theirs,
                    "verdict": model.verdict,
                    "base_verdict": base.verdict,
                },
            },
        )
        recorded += created
    if recorded:
        events_recorded.send(sender=ModelEvent)
    return recorded
