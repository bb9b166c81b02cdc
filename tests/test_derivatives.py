"""Derivatives linked to their base through the card's `base_model`: how far up the chain goes
(no loops), and whether a conversion still carries the base's current template, an older one of
the base's (which, and until when), or an edited one; both directions on the model pages."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from alerts.models import Channel, ChannelKind, Rule, Subscription, SubscriptionTarget
from registry.derivatives import (
    EDITED,
    OLDER,
    SAME,
    UNKNOWN,
    bases,
    derivatives,
    drift,
    record_stale_fixes,
    refresh_drift,
)
from registry.models import (
    EventKind,
    HubModel,
    ModelEvent,
    TemplateChange,
    TemplateVersion,
    Verdict,
)
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
    # An edited copy links to how it differs from the base's current template.
    edited = client.get("/m/mlx-community/edited/").content.decode()
    link = re.search(
        r'href="(/t/[0-9a-f]{64}/vs/[0-9a-f]{64}/)\?model=[^"]*">How it differs', edited
    )
    assert link is not None
    assert client.get(link.group(1)).status_code == 200
    missing = client.get("/m/mlx-community/missing/").content.decode()
    assert "names <code>nobody/not-tracked</code> as its base" in missing
    assert "/track/?repo_id=nobody/not-tracked" in missing
    plain = client.get("/m/x/loop-a/").content.decode()
    assert "Derived from" in plain


# --- stored drift, the catalog filters, and the alerts that follow derivatives -----------------


def test_drift_is_stored_for_the_catalog_filters(
    family: dict[str, HubModel], client: Client
) -> None:
    refresh_drift(family["base"])  # the base's sync fills in its derivatives
    refresh_drift(family["finetune"])  # a derivative's sync fills in itself
    stored = dict(HubModel.objects.values_list("repo_id", "drift"))
    assert stored["mlx-community/stale"] == "older"
    assert stored["mlx-community/same"] == "same"
    assert stored["mlx-community/edited"] == "edited"
    assert stored["mlx-community/finetune"] == "same"  # same as the stale copy it came from
    assert stored[BASE] == "" and stored["mlx-community/missing"] == ""
    HubModel.objects.filter(repo_id="mlx-community/stale").update(format="mlx")

    def listed(**params: str) -> set[str]:
        body = client.get("/", params).content.decode()
        return {r for r in stored if f'class="repo" href="/m/{r}/"' in body}

    assert listed(drift="differs") == {"mlx-community/stale", "mlx-community/edited"}
    assert listed(drift="older") == {"mlx-community/stale"}
    assert listed(format="mlx") == {"mlx-community/stale"}
    assert listed(format="mlx", drift="same") == set()
    api = client.get("/api/models", {"drift": "differs"}).json()
    assert {row["repo_id"] for row in api["results"]} == {
        "mlx-community/stale",
        "mlx-community/edited",
    }
    assert client.get("/api/models", {"drift": "sideways"}).status_code == 400
    # One model's detail says the same as its row.
    detail = client.get("/api/models/mlx-community/stale").json()
    assert (detail["format"], detail["drift"], detail["base_model"]) == ("mlx", "older", BASE)


def _stale_and_fixed(family: dict[str, HubModel]) -> HubModel:
    refresh_drift(family["base"])
    refresh_drift(family["finetune"])
    HubModel.objects.filter(pk=family["base"].pk).update(verdict=Verdict.SAFE)
    HubModel.objects.filter(pk=family["stale"].pk).update(verdict=Verdict.UNSAFE)
    return HubModel.objects.get(pk=family["stale"].pk)


def test_a_derivative_that_still_carries_a_fixed_template_is_an_event_once(
    family: dict[str, HubModel],
) -> None:
    stale = _stale_and_fixed(family)
    assert record_stale_fixes([family["base"].pk]) == 1
    event = ModelEvent.objects.get(kind=EventKind.BASE_FIXED)
    assert event.model_id == stale.pk
    assert event.summary.startswith(f"{stale.repo_id} still carries {BASE}'s template from commit")
    assert event.data["base_verdict"] == "safe" and event.data["verdict"] == "unsafe"
    # Asked again (a re-sync, another verdict refresh): nothing new.
    assert record_stale_fixes([family["base"].pk, stale.pk]) == 0
    # An edited copy is not "still carrying" anything, whatever its verdict.
    HubModel.objects.filter(pk=family["edited"].pk).update(verdict=Verdict.UNSAFE)
    assert record_stale_fixes([family["base"].pk, family["edited"].pk]) == 0


def test_subscribing_to_a_base_can_include_its_derivatives(family: dict[str, HubModel]) -> None:
    stale = _stale_and_fixed(family)
    user = User.objects.create_user("reader", "r@example.org", "pw")
    channel = Channel.objects.create(
        owner=user, kind=ChannelKind.EMAIL, address="r@example.org", confirmed_at=timezone.now()
    )

    def subscribe(**fields: object) -> Subscription:
        return Subscription.objects.create(user=user, channel=channel, **fields)

    base_only = subscribe(target=SubscriptionTarget.MODEL, model=family["base"])
    with_derivatives = subscribe(
        target=SubscriptionTarget.MODEL, model=family["base"], with_derivatives=True
    )
    rule = subscribe(target=SubscriptionTarget.RULE, rule=Rule.BASE_FIXED)
    unsafe_rule = subscribe(target=SubscriptionTarget.RULE, rule=Rule.TURNS_UNSAFE)
    record_stale_fixes([family["base"].pk])
    fixed = ModelEvent.objects.get(kind=EventKind.BASE_FIXED)
    assert set(Subscription.objects.matching(fixed)) == {with_derivatives, rule}
    # Any event of a derivative two levels down reaches the base's subscription too.
    deep = ModelEvent.record(
        family["finetune"].pk, EventKind.TEMPLATE_CHANGED, "t:deep", "changed", {}
    )
    assert set(Subscription.objects.matching(deep)) == {with_derivatives}
    verdict = ModelEvent.record(
        stale.pk, EventKind.VERDICT_CHANGED, "v:stale", "turned", {"new": "unsafe"}
    )
    assert set(Subscription.objects.matching(verdict)) == {with_derivatives, unsafe_rule}
    assert base_only.describe() == BASE
    assert with_derivatives.describe() == f"{BASE} and its derivatives"
    assert rule.event_labels == ["Still carries a template its base has fixed"]
