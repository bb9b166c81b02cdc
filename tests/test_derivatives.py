"""Derivatives linked to their base through the card's `base_model`: how far up the chain goes
(no loops), and whether a conversion still carries the base's current template, an older one of
the base's (which, and until when), or an edited one; both directions on the model pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from registry.derivatives import EDITED, OLDER, SAME, UNKNOWN, bases, derivatives, drift
from registry.models import HubModel, TemplateChange, TemplateVersion
from tests.dashboard_data import add_model
from tests.dashboard_data import healthy_service as healthy_service  # a fixture

pytestmark = pytest.mark.django_db

OLD = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
NEW = OLD + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
EDIT = NEW + "{#- edited by the converter -#}"
BASE = "Qwen/Qwen3-8B"


@pytest.fixture
def family() -> dict[str, HubModel]:
    """A base whose template changed (OLD, then NEW) and models derived from it."""
    now = timezone.now()
    base = add_model(BASE, NEW, commit="b" * 40, check=False, downloads=9)
    old, _ = TemplateVersion.objects.get_or_create_for_text(OLD)
    new = base.current_snapshot.default_template  # type: ignore[union-attr]
    TemplateChange.objects.create(
        model=base,
        commit_sha="a" * 40,
        new_version=old,
        committed_at=now - timedelta(days=90),
        title="Add template",
    )
    TemplateChange.objects.create(model=base, commit_sha="b" * 40, old_version=old,
                                  new_version=new, committed_at=now - timedelta(days=10),
                                  title="Fix the generation prompt")  # fmt: skip
    made = {"base": base}
    for name, text, base_model in (
        ("stale", OLD, BASE),  # converted before the fix
        ("same", NEW, BASE),
        ("edited", EDIT, BASE.lower()),  # cards do not always match the case
        ("finetune", OLD, "mlx-community/stale"),  # a fine-tune of the stale conversion
        ("missing", NEW, "nobody/not-tracked"),
        ("self", NEW, "mlx-community/self"),
    ):
        made[name] = add_model(f"mlx-community/{name}", text, commit=f"{len(made):040x}",
                               check=False, base_model=base_model, downloads=len(made))  # fmt: skip
    made["loop-a"] = add_model("x/loop-a", NEW, commit="c" * 40, check=False, base_model="x/loop-b")
    made["loop-b"] = add_model("x/loop-b", NEW, commit="d" * 40, check=False, base_model="x/loop-a")
    return made


def test_the_chain_of_bases_stops_at_untracked_repos_and_loops(family: dict[str, HubModel]) -> None:
    assert bases(family["stale"]) == [family["base"]]
    assert bases(family["finetune"]) == [family["stale"], family["base"]]  # two levels
    assert bases(family["missing"]) == []
    assert bases(family["self"]) == []
    assert bases(family["loop-a"]) == [family["loop-b"]]  # and not back to itself
    assert set(derivatives(family["base"])) == {family[n] for n in ("stale", "same", "edited")}


def test_drift_says_same_older_edited(family: dict[str, HubModel]) -> None:
    base = family["base"]
    assert drift(family["same"], base).kind == SAME
    older = drift(family["stale"], base)
    assert older.kind == OLDER and older.since is not None
    assert older.since.commit_sha == "a" * 40 and older.replaced_at is not None
    assert "older one of Qwen/Qwen3-8B's" in older.sentence
    assert drift(family["edited"], base).kind == EDITED
    base.current_snapshot = None
    assert drift(family["same"], base).kind == UNKNOWN


@pytest.mark.usefixtures("healthy_service")
def test_both_model_pages_show_the_link(client: Client, family: dict[str, HubModel]) -> None:
    stale = client.get("/m/mlx-community/stale/").content.decode()
    assert f'href="/m/{BASE}/">{BASE}</a>' in stale
    assert "an older one of Qwen/Qwen3-8B" in stale and "What the base changed since" in stale
    base = client.get(f"/m/{BASE}/").content.decode()
    section = base.split('id="lineage-h"')[1].split("</section>")[0]
    assert "mlx-community/stale" in section and "Still carries this model" in section
    assert "Same template as this model" in section and "An edited template" in section
    missing = client.get("/m/mlx-community/missing/").content.decode()
    assert "names <code>nobody/not-tracked</code> as its base" in missing
    assert "/track/?repo_id=nobody/not-tracked" in missing
    plain = client.get("/m/x/loop-a/").content.decode()
    assert "Derived from" in plain
