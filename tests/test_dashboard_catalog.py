"""The catalog page `/`: search, filters, sort, pagination, htmx fragments, query counts."""

from __future__ import annotations

import re
import zoneinfo
from datetime import UTC, datetime
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from django.db import connection
from django.db.models import CharField
from django.db.models.expressions import RawSQL
from django.template import engines
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse, set_script_prefix
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import Environment
from markupsafe import Markup
from pytest_django import DjangoAssertNumQueries
from pytest_django.fixtures import Settings as SettingsWrapper

from checks.digest import digest
from checks.reports import TemplateReport
from dashboard import catalog as catalog_module
from dashboard import views as views_module
from dashboard.jinja import day_element, form_menus
from dashboard.templatetags.dashboard import (
    FRAME_FILES,
    FRAME_LINKS,
    fixed_url,
    frame,
    model_path,
    model_url,
    model_url_stem,
)
from dashboard.urls import RepoPartConverter
from registry.demo import DEMO_MODELS, seed_demo_catalog
from registry.models import DiscoveryRun, HubModel, ModelStatus
from registry.verdicts import latest_check, refresh_verdicts
from tests.dashboard_data import (
    HOSTILE_REPO,
    PENDING_REPO,
    Catalog,
    add_model,
    build_catalog,
    healthy_service,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.django_db
#: A row's version on PostgreSQL: a write, even of the same values, gives it a new one.
XMIN = RawSQL("xmin::text", (), output_field=CharField())

# Writes an empty think block into assistant turns only with thinking off: that is exactly the
# generation prompt then (cache-safe); otherwise the generation prompt opens `<think>\n`, which
# history never writes (the prompt breaks).
THINKING_OFF_SAFE = (
    "{%- for message in messages %}{%- if message.role == 'assistant' %}"
    "{%- set off = enable_thinking is defined and enable_thinking is false %}"
    "{{- '<|im_start|>assistant\\n' + ('<think>\\n\\n</think>\\n\\n' if off else '')"
    " + (message.content or '') + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


def rows(body: str) -> list[str]:
    """Repo ids in the order the catalog lists them."""
    found = []
    for chunk in body.split('class="repo" href="/m/')[1:]:
        found.append(chunk.split("/", 2)[0] + "/" + chunk.split("/", 2)[1])
    return found


def test_demo_catalog_is_seeded_once_and_checked() -> None:
    assert seed_demo_catalog() == len(DEMO_MODELS)
    assert seed_demo_catalog() == 0
    demo = HubModel.objects.filter(is_demo=True)
    assert demo.count() == len(DEMO_MODELS)
    # The engine ran: no demo model is left "not checked yet".
    assert set(demo.values_list("verdict", flat=True)) == {"safe", "unsafe"}


def test_demo_data_looks_like_what_a_sync_writes(client: Client) -> None:
    """Commit ids and dates, a first-template change per model, and one model whose template
    changed later, so history, version diff and feed have something to show; labelled demo."""
    seed_demo_catalog()
    for demo in DEMO_MODELS:
        model = HubModel.objects.get(repo_id=demo.repo_id)
        snapshot = model.current_snapshot
        assert snapshot is not None
        assert re.fullmatch(r"[0-9a-f]{40}", snapshot.commit_sha)
        assert snapshot.commit_sha == model.last_commit_sha != "0" * 40
        changes = list(model.changes.order_by("committed_at"))
        assert len(changes) == len(demo.history)
        assert changes[0].old_version is None and changes[-1].snapshot == snapshot
        assert all(c.committed_at is not None and c.title for c in changes)
        page = client.get(f"/m/{demo.repo_id}/").content.decode()
        assert "(demo model)" in page  # labelled, never passed off as read from the Hub
        assert snapshot.committed_at is not None
        assert f"{snapshot.committed_at:%Y-%m-%d}" in page
        assert f"/m/{demo.repo_id}/at/{snapshot.commit_sha}/" in page
        assert "from local" not in page and "imported folder" not in page
    thinker = HubModel.objects.get(repo_id="cachesafe-demo/thinker-30b-a3b")
    old, new = thinker.changes.order_by("committed_at")
    assert old.new_version is not None and new.new_version is not None
    verdicts = [
        getattr(latest_check(v), "verdict", None) for v in (old.new_version, new.new_version)
    ]
    assert verdicts == ["safe", "unsafe"]
    page = client.get(f"/m/{thinker.repo_id}/").content.decode()
    diff = f"/t/{new.new_version.sha256}/vs/{old.new_version.sha256}/"
    assert diff in page
    assert client.get(diff).status_code == 200
    assert client.get(f"/m/{thinker.repo_id}/at/{old.commit_sha}/").status_code == 200
    assert client.get("/feeds/changes.atom").content.decode().count("<entry>") == len(
        [c for d in DEMO_MODELS for c in d.history]
    )


def test_catalog_lists_every_model_with_its_verdict(client: Client, catalog: Catalog) -> None:
    body = client.get("/").content.decode()
    for demo in DEMO_MODELS:
        assert demo.repo_id in body
    assert "Cache-safe" in body and "Breaks the cache" in body and "Not checked yet" in body
    assert rows(body)[0] == "cachesafe-demo/chatml-tools-7b"  # most downloads first


def test_search_matches_repo_id_author_family_and_tags(client: Client, catalog: Catalog) -> None:
    assert rows(client.get("/", {"q": "marker"}).content.decode()) == [
        "cachesafe-demo/marker-chat-8b"
    ]
    assert rows(client.get("/", {"q": "slow-org"}).content.decode()) == [PENDING_REPO]
    assert rows(client.get("/", {"q": "thinker"}).content.decode()) == [
        "cachesafe-demo/thinker-30b-a3b"
    ]
    assert rows(client.get("/", {"q": "reasoning"}).content.decode()) == [
        "cachesafe-demo/thinker-30b-a3b"
    ]
    none = client.get("/", {"q": "no-such-model"}).content.decode()
    assert rows(none) == [] and "No model matches" in none
    assert "/track/?repo_id=no-such-model" in none


def test_filters_narrow_the_list(client: Client, catalog: Catalog) -> None:
    safe = rows(client.get("/", {"verdict": "safe"}).content.decode())
    assert safe == ["cachesafe-demo/chatml-tools-7b"]
    hybrid = rows(client.get("/", {"hybrid": "yes"}).content.decode())
    assert hybrid == ["cachesafe-demo/thinker-30b-a3b"]
    assert catalog.changed.repo_id not in rows(client.get("/", {"hybrid": "no"}).content.decode())
    by_author = rows(client.get("/", {"author": "evil-org"}).content.decode())
    assert by_author == [HOSTILE_REPO]
    # In any case, as the Hub takes an owner's name.
    assert rows(client.get("/", {"author": "Evil-ORG"}).content.decode()) == [HOSTILE_REPO]
    api = client.get("/api/models", {"author": "EVIL-org"}).json()
    assert [r["repo_id"] for r in api["results"]] == [HOSTILE_REPO]
    # The thinker's template reads enable_thinking; the others have no switch.
    thinking = rows(client.get("/", {"thinking": "same"}).content.decode())
    assert thinking == ["cachesafe-demo/thinker-30b-a3b"]
    # A template that is safe only with thinking off: listed under safe_off, not safe_on.
    add_model("fix-org/thinks-off", THINKING_OFF_SAFE, commit="f" * 40)
    assert rows(client.get("/", {"thinking": "safe_off"}).content.decode()) == [
        "fix-org/thinks-off"
    ]
    assert rows(client.get("/", {"thinking": "safe_on"}).content.decode()) == []
    differs = client.get("/", {"thinking": "differs"}).content.decode()
    assert rows(differs) == ["fix-org/thinks-off"]
    badges = differs.split('class="verdicts"')[1].split("</div>")[0]
    assert "thinking off: Cache-safe" in badges and "thinking on: Breaks the cache" in badges
    tools_safe = rows(client.get("/", {"tools": "safe"}).content.decode())
    assert tools_safe == ["cachesafe-demo/chatml-tools-7b"]
    assert len(rows(client.get("/", {"probe": "none"}).content.decode())) == 6  # no probe yet


# Reasoning is written only for the last assistant message: the reply the model emitted is lost,
# so the prompt carries over (safe on a trimmable cache) but a hybrid cache keeps nothing.
REPLY_LOST = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.reasoning_content and loop.last -%}"
    "<assistant><think>{{ m.reasoning_content }}</think>{{ m.content }}</s>"
    "{%- else -%}<{{ m.role }}>{{ m.content }}</s>{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt %}<assistant>{% endif -%}"
)


def test_the_catalog_filters_on_the_readers_setup(client: Client, catalog: Catalog) -> None:
    add_model("fix-org/reply-lost", REPLY_LOST, commit="e" * 40)
    trimmable = rows(client.get("/", {"verdict": "safe"}).content.decode())
    assert "fix-org/reply-lost" in trimmable
    # On a hybrid model without checkpoints the lost reply costs every turn's cache.
    hybrid = client.get("/", {"verdict": "safe", "engine": "hybrid"}).content.decode()
    assert "fix-org/reply-lost" not in rows(hybrid)
    assert "cachesafe-demo/chatml-tools-7b" in rows(hybrid)
    broken = client.get("/", {"verdict": "unsafe", "engine": "hybrid"}).content.decode()
    assert "fix-org/reply-lost" in rows(broken)
    # Rows show the setup's verdict, not the headline's, and link to the model page judging
    # the same setup (without a setup the link carries nothing).
    assert 'href="/m/fix-org/reply-lost/"' in client.get("/", {"verdict": "safe"}).content.decode()
    row = broken.split('href="/m/fix-org/reply-lost/?engine=hybrid"')[1].split("</tr>")[0]
    assert 'title="For your setup">Breaks the cache' in row
    page = client.get("/m/fix-org/reply-lost/", {"engine": "hybrid"}).content.decode()
    panel = page.split('class="setup"')[1].split("</section>")[0]
    assert "Your setup:" in panel and "Breaks the cache" in panel
    # With checkpoints the prompt comes back, and the API answers the same.
    checked = client.get(
        "/api/models", {"verdict": "safe", "engine": "hybrid_checkpoints", "client": "typical"}
    ).json()
    assert "fix-org/reply-lost" in [r["repo_id"] for r in checked["results"]]
    assert {r["setup_verdict"] for r in checked["results"]} == {"safe"}
    assert client.get("/api/models", {"engine": "quantum"}).status_code == 400
    # A blank parameter is one left out, as the catalog's form sends it for the default.
    blank = client.get("/api/models", {"verdict": "safe", "client": "", "engine": ""})
    assert blank.status_code == 200, blank.content
    plain = client.get("/api/models", {"verdict": "safe"}).json()
    assert blank.json()["results"] == plain["results"]
    detail = client.get("/api/models/fix-org/reply-lost", {"client": "", "thinking": ""})
    assert detail.status_code == 200, detail.content


def test_a_setup_of_typical_values_keeps_its_menus_links_and_one_address(
    client: Client, catalog: Catalog
) -> None:
    """`/?client=typical` chose the typical setup (rows judged for the template's defaults
    alone), but the client menu, whose empty choice reads "Typical", selected nothing: the next
    filter change sent `client=` and dropped the setup, and the rows linked to the headline.
    A typical value is the absent one; a setup of them alone is `thinking=default`, which the
    thinking menu shows, and the catalog sends any other spelling there (one cached copy)."""
    for spelt in ({"client": "typical"}, {"engine": "trimmable", "client": "typical"}):
        moved = client.get("/", {"q": "demo", **spelt})
        assert moved.status_code == 301
        found = urlsplit(moved["Location"])
        assert (found.path, parse_qs(found.query)) == (
            "/",
            {"q": ["demo"], "thinking": ["default"]},
        )
    moved = client.get("/", {"client": "typical", "engine": "hybrid"})
    assert moved.status_code == 301 and moved["Location"] == "/?engine=hybrid"
    page = client.get("/", {"q": "demo", "thinking": "default"}).content.decode()
    form = page.split("<form")[1].split("</form>")[0]
    assert '<option value="default" selected>' in form
    assert 'title="For your setup"' in page
    assert f'href="/m/{catalog.changed.repo_id}/?thinking=default"' in page
    # Where the thinking menu holds a filter, an explicit typical client is what keeps the
    # setup: its menu shows it chosen, so the next change sends it again.
    kept = client.get("/", {"client": "typical", "thinking": "safe_on"})
    assert kept.status_code == 200
    assert '<option value="typical" selected>' in kept.content.decode()


def test_a_setup_value_with_spaces_around_it_is_applied_at_its_clean_address(
    client: Client, catalog: Catalog
) -> None:
    """The catalog applied `?engine=%20hybrid` where the model page ignored it and the API
    refused it; now every surface strips it. The catalog sends it to the clean URL, which its
    links use; a value still unknown once stripped stays in the URL, ignored and said so."""
    moved = client.get("/", {"engine": " hybrid", "thinking": "off "})
    assert moved.status_code == 301
    found = urlsplit(moved["Location"])
    assert parse_qs(found.query) == {"engine": ["hybrid"], "thinking": ["off"]}
    stale = client.get("/", {"engine": " quantum"})
    assert stale.status_code == 200
    assert "engine=quantum" in stale.content.decode()


def test_a_repo_the_hub_never_had_is_not_listed(client: Client, catalog: Catalog) -> None:
    """Anyone may ask to track a name: a made-up one, which the Hub says it does not have,
    stays out of the catalog and the API's list; its page says what the Hub answered. A repo
    that was there and vanished keeps its row."""
    HubModel.objects.create(
        repo_id="nobody/made-up", author="nobody", status=ModelStatus.MISSING, downloads=10**9
    )
    listed = rows(client.get("/").content.decode())
    assert "nobody/made-up" not in listed
    api = client.get("/api/models").json()
    assert "nobody/made-up" not in [r["repo_id"] for r in api["results"]]
    assert client.get("/m/nobody/made-up/").status_code == 200
    vanished = HubModel.objects.filter(current_snapshot__isnull=False).first()
    assert vanished is not None
    HubModel.objects.filter(pk=vanished.pk).update(status=ModelStatus.MISSING)
    client_rows = rows(client.get("/", {"sort": "name"}).content.decode())
    assert vanished.repo_id in client_rows and len(client_rows) == len(listed)


def test_unknown_filter_values_are_ignored_not_errors(client: Client, catalog: Catalog) -> None:
    response = client.get("/", {"verdict": "bogus", "sort": "'; drop", "page": "x"})
    assert response.status_code == 200
    assert len(rows(response.content.decode())) == 5


def test_sort_by_name_and_by_last_change(
    client: Client, catalog: Catalog, settings: SettingsWrapper
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0  # bulk updates below send no signal
    for repo_id in ("Qwen/z-mixcase", "ai-sage/y-mixcase", "Acme/x-mixcase"):
        HubModel.objects.create(repo_id=repo_id, author=repo_id.split("/")[0], downloads=1)
    names = rows(client.get("/", {"sort": "name"}).content.decode())
    # As a reader reads names, whatever the case (the database's collation may compare bytes).
    assert names == sorted(names, key=lambda name: (name.upper(), name))
    mixed = [n for n in names if n.endswith("-mixcase")]
    assert mixed == ["Acme/x-mixcase", "ai-sage/y-mixcase", "Qwen/z-mixcase"]
    # The same order when the page walks the order's index (a search past the count's cap).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalog_module, "COUNT_CAP", 2)
        walked = rows(client.get("/", {"q": "mixcase", "sort": "name"}).content.decode())
    assert walked == mixed
    # A model with no template change yet comes after every dated one, on PostgreSQL too
    # (whose descending order puts nulls first).
    HubModel.objects.filter(repo_id=PENDING_REPO).update(last_template_change_at=None)
    undated = HubModel.objects.filter(last_template_change_at=None).values_list("repo_id")
    undated_ids = sorted(repo_id for (repo_id,) in undated)
    by_change = rows(client.get("/", {"sort": "changed"}).content.decode())
    assert PENDING_REPO in undated_ids and len(undated_ids) < len(by_change) == len(names)
    assert by_change[-len(undated_ids) :] == undated_ids  # last, by repo id
    HubModel.objects.filter(repo_id=PENDING_REPO).update(
        last_template_change_at="2030-01-01T00:00Z"
    )
    assert rows(client.get("/", {"sort": "changed"}).content.decode())[0] == PENDING_REPO


def test_pagination_keeps_the_filters_in_its_links(client: Client) -> None:
    HubModel.objects.bulk_create(
        HubModel(repo_id=f"bulk/m{i:03d}", author="bulk", status=ModelStatus.OK, downloads=i)
        for i in range(120)
    )
    first = client.get("/", {"q": "bulk", "sort": "name"}).content.decode()
    assert rows(first)[0] == "bulk/m000" and len(rows(first)) == 50
    assert "Page 1 of 3" in first
    assert 'href="?q=bulk&amp;sort=name&amp;page=2"' in first
    third = client.get("/", {"q": "bulk", "sort": "name", "page": "3"}).content.decode()
    assert rows(third)[-1] == "bulk/m119" and len(rows(third)) == 20


def test_past_the_count_cap_pages_follow_while_they_are_full(
    client: Client, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search broader than the count's cap says "N+" and pages on by reading one row past
    each page (no count of every match), up to MAX_PAGES; past its matches a page says so."""
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 10)
    monkeypatch.setattr(catalog_module, "MAX_PAGES", 4)
    monkeypatch.setattr(views_module, "PAGE_SIZE", 5)
    HubModel.objects.bulk_create(
        HubModel(repo_id=f"bulk/m{i:03d}", author="bulk", status=ModelStatus.OK, downloads=i)
        for i in range(17)
    )

    def page(number: int) -> str:
        return client.get("/", {"q": "bulk", "sort": "name", "page": str(number)}).content.decode()

    first = page(1)
    assert "10+ models matching" in first and "Page 1</span>" in first
    assert rows(first) == [f"bulk/m{i:03d}" for i in range(5)]
    assert 'rel="next" href="?q=bulk&amp;sort=name&amp;page=2"' in first
    monkeypatch.setattr(catalog_module, "MAX_PAGES", 3)
    third = page(3)  # full, and more follow, but the pager stops here
    assert rows(third) == [f"bulk/m{i:03d}" for i in range(10, 15)]
    assert 'rel="next"' not in third and 'rel="prev"' in third
    monkeypatch.setattr(catalog_module, "MAX_PAGES", 20)
    assert 'rel="next" href="?q=bulk&amp;sort=name&amp;page=4"' in page(3)
    fourth = page(4)
    assert rows(fourth) == ["bulk/m015", "bulk/m016"] and 'rel="next"' not in fourth
    fifth = page(5)
    assert rows(fifth) == [] and "No more models on page 5" in fifth
    assert "No model matches" not in fifth


def test_the_form_menus_are_rendered_once_per_state() -> None:
    """The catalog form's menus (dashboard/jinja.py `menu`): the macro's markup, kept per
    menu and selection, so a search page does not render them again; kept nothing while
    templates reload."""
    env = engines["jinja2"].env  # type: ignore[attr-defined]
    macro = env.get_template("dashboard/catalog_menu.html").module.menu
    choices = [("safe", "Cache-safe"), ("unsafe", "Breaks the cache")]
    menu = env.globals["menu"]
    plain = menu("verdict", "Verdict", choices)
    assert plain == Markup(macro("verdict", "Verdict", tuple(choices), "Any", None, ""))
    assert " selected" not in plain and '<option value="">Any</option>' in plain
    chosen = menu("verdict", "Verdict", iter(choices), selected="unsafe")
    assert '<option value="unsafe" selected>Breaks the cache</option>' in chosen
    assert menu("verdict", "Verdict", choices, selected="unsafe") is chosen  # kept
    skipped = menu("engine", "Engine", [("trimmable", "T"), ("block", "B")], "Default", "trimmable")
    assert "trimmable" not in skipped and '<option value="">Default</option>' in skipped
    reloading = Environment(auto_reload=True)
    reloading.loader, reloading.autoescape = env.loader, True
    fresh = form_menus(reloading)
    assert fresh("verdict", "Verdict", choices) == plain
    assert fresh("verdict", "Verdict", choices) is not fresh("verdict", "Verdict", choices)


@settings(max_examples=50, deadline=None)
@given(
    st.datetimes(datetime(1990, 1, 1), datetime(2200, 1, 1), timezones=st.just(UTC)),
    st.sampled_from(["UTC", "Asia/Kolkata", "America/St_Johns"]),
)
def test_a_rows_day_reads_as_the_django_template_languages_dates(
    moment: datetime, zone: str
) -> None:
    """A catalog row's `<time>` element (dashboard/jinja.py `day_element`, in the zone its page
    looked up once): the moment and the day that the Django template language's `date:'c'`
    and `date:'Y-m-d'` print, in the current time zone."""
    template = engines["django"].from_string(
        """<time datetime="{{ moment|date:'c' }}">{{ moment|date:'Y-m-d' }}</time>"""
    )
    with timezone.override(zoneinfo.ZoneInfo(zone)):
        current = timezone.get_current_timezone()
        assert day_element(moment, current) == template.render({"moment": moment})


def test_a_rows_day_is_the_day_in_the_current_time_zone(client: Client, catalog: Catalog) -> None:
    """The page looks the time zone up once (`current_zone`) and writes each row's day in it."""
    moment = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
    HubModel.objects.filter(repo_id="cachesafe-demo/thinker-30b-a3b").update(
        last_template_change_at=moment
    )
    with timezone.override(zoneinfo.ZoneInfo("Asia/Kolkata")):
        body = client.get("/", {"q": "thinker"}).content.decode()
    assert '<time datetime="2026-03-02T05:00:00+05:30">2026-03-02</time>' in body
    body = client.get("/", {"q": "thinker-30b"}).content.decode()  # (not the page kept above)
    assert '<time datetime="2026-03-01T23:30:00+00:00">2026-03-01</time>' in body


def test_a_samples_counts_are_kept_per_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample counts the models holding every term of a search once (`SearchSample.matching`)
    and keeps at most `SAMPLE_SEARCHES` counts, starting again past them."""
    sample = catalog_module.SearchSample(("qwen ggufƈx", "qwen", "gguf llama qwen"))
    assert sample.matching(["qwen", "gguf"]) == 2
    assert sample.matching(["gguf", "llama"]) == 1
    assert (sample.matching(["qwen"]), sample.holding("llama")) == (3, 1 / 3)
    assert catalog_module.SearchSample().holding("qwen") == 0.0
    kept = sample._matched
    assert kept[("qwen", "gguf")] == (2, 0) and len(kept) == 4
    monkeypatch.setattr(catalog_module, "SAMPLE_SEARCHES", 4)
    assert sample.matching(["ƈx"]) == 1
    assert kept == {("ƈx",): (1, 0)}


def test_a_samples_floor_counts_blocks_not_models() -> None:
    """The floor a sample puts under a search's matches (`SearchSample.matches_floor`) is one
    of the table's blocks that hold one: a dozen matches in one sampled block say little more
    than one, the same dozen across a dozen blocks say more. With every block sampled it is
    the matches themselves."""
    clustered = catalog_module.SearchSample(
        tuple(["org-42 qwen"] * 12 + ["llama"] * 88),
        tuple([7] * 12 + list(range(88))),
        fraction=0.01,
    )
    spread = catalog_module.SearchSample(
        tuple(["org-42 qwen"] * 12 + ["llama"] * 88), tuple(range(100)), fraction=0.01
    )
    assert clustered.matching(["qwen"]) == spread.matching(["qwen"]) == 12
    assert clustered.matches_floor(["qwen"]) == 0.0  # one block: no bound at 3 deviates
    # 12 blocks: a Poisson mean of 4.19 at least (the exact bound, 3 deviates one-sided),
    # over a hundredth.
    assert spread.matches_floor(["qwen"]) == pytest.approx(419, rel=0.02)
    assert spread.matches_floor(["gemma"]) == 0.0
    many = catalog_module.SearchSample(tuple(["qwen"] * 400), tuple(range(400)), fraction=0.01)
    assert 30_000 < many.matches_floor(["qwen"]) < 40_000  # 40,000 the estimate
    whole = catalog_module.SearchSample(("qwen", "qwen", "gguf"), (0, 0, 1), fraction=1.0)
    assert whole.matches_floor(["qwen"]) == 2.0


def test_htmx_search_returns_only_the_results_fragment(client: Client, catalog: Catalog) -> None:
    response = client.get("/", {"q": "thinker"}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="results"')
    assert "<html" not in body
    assert rows(body) == ["cachesafe-demo/thinker-30b-a3b"]


@pytest.mark.usefixtures("healthy_service")
def test_the_catalog_costs_two_queries_however_many_models(
    client: Client,
    catalog: Catalog,
    django_assert_num_queries: DjangoAssertNumQueries,
    settings: SettingsWrapper,
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0  # count the rendering, not the page cache
    HubModel.objects.bulk_create(
        HubModel(repo_id=f"bulk/m{i:03d}", author="bulk", status=ModelStatus.OK) for i in range(80)
    )
    # One COUNT for the paginator, one SELECT with the catalog verdicts joined: no N+1.
    with django_assert_num_queries(2):
        response = client.get("/", {"verdict": "pending", "hybrid": "no"})
    assert response.status_code == 200
    assert len(rows(response.content.decode())) == 50
    # A narrow search reads its rows through the search index (see test_search_plan.py), and
    # one that matches nothing stops at the count. A process first reads the table's size
    # (again each minute; `dashboard.catalog.table_blocks`): not counted here.
    client.get("/", {"q": "bulk/m07"})
    with django_assert_num_queries(2):
        narrow = client.get("/", {"q": "bulk/m07"}).content.decode()
    assert len(rows(narrow)) == 10 and "10 models matching" in narrow
    assert 'rel="next"' not in narrow
    broad = client.get("/", {"q": "bulk/"}).content.decode()
    assert len(rows(broad)) == 50 and "80 models matching" in broad and "Page 1 of 2" in broad
    second = client.get("/", {"q": "bulk/", "page": "2"}).content.decode()
    assert len(rows(second)) == 30 and "Page 2 of 2" in second
    with django_assert_num_queries(1):
        nothing = client.get("/", {"q": "no-such-model-anywhere"}).content.decode()
    assert "0 models matching" in nothing and "No model matches" in nothing
    # The landing page adds the discovery panel's, however many models: the latest run, how
    # far its new repos got (one aggregate), whether any model is real (not demo).
    DiscoveryRun.objects.create(
        trigger="command", new=2, new_repo_ids=["bulk/m001", "a/b"], finished_at=timezone.now()
    )
    with django_assert_num_queries(5):
        response = client.get("/")
    assert "1 of 2 read so far" in response.content.decode()


def test_post_is_refused(client: Client) -> None:
    assert client.post("/").status_code == 405


def test_models_without_a_verdict_show_why(client: Client, catalog: Catalog) -> None:
    HubModel.objects.create(
        repo_id="gated-org/locked", author="gated-org", status=ModelStatus.GATED, downloads=10**9
    )
    body = client.get("/").content.decode()
    first_row = body.split('class="repo" href="/m/gated-org/locked/"')[1].split("</tr>")[0]
    assert "Gated" in first_row and "Not checked yet" not in first_row


def test_a_reuse_column_to_sort_by_and_summaries_that_keep_their_numbers(
    client: Client, catalog: Catalog
) -> None:
    body = client.get("/", {"sort": "reuse"}).content.decode()
    assert "Prompt reuse</abbr>" in body
    by_repo = dict(HubModel.objects.values_list("repo_id", "reuse"))
    shares = [by_repo.get(repo) for repo in rows(body)]
    known = [share for share in shares if share is not None]
    assert len(known) >= 2 and known == sorted(known, reverse=True)
    # Models with no figure yet come last, not first.
    assert shares[: len(known)] == known
    # The unsafe demo's summary ends its sentence with the share; the row keeps it whole.
    unsafe = body.split(f'href="/m/{catalog.unsafe.repo_id}/"')[1].split("</td>")[0]
    summary = unsafe.split('class="summary">')[1].split("</div>")[0]
    assert "%" in summary and ("can come from the cache" in summary)


def test_a_checks_reuse_figure_lands_on_the_model_and_an_unchanged_one_writes_nothing(
    catalog: Catalog,
) -> None:
    """`refresh_verdicts` puts the default template's reuse figure on the model (the catalog's
    "Prompt reuse" order walks it there), and leaves a model whose figure did not change
    unwritten: on PostgreSQL every write is a new row version that the catalog's indexes
    carry until a vacuum."""
    unsafe, safe = catalog.unsafe, catalog.safe
    versions = [m.current_snapshot.default_template_id for m in (unsafe, safe)]  # type: ignore[union-attr]
    run = latest_check(unsafe.current_snapshot.default_template)  # type: ignore[union-attr]
    assert run is not None and run.report
    expected = digest(TemplateReport.from_dict(run.report)).reuse
    assert expected is not None and unsafe.reuse == expected
    HubModel.objects.filter(pk=unsafe.pk).update(reuse=0.123)

    def row_versions() -> dict[int, str]:
        if connection.vendor != "postgresql":
            return {}
        return dict(HubModel.objects.filter(pk__in=[unsafe.pk, safe.pk]).values_list("pk", XMIN))

    before = row_versions()
    refresh_verdicts(versions)
    after = row_versions()
    unsafe.refresh_from_db()
    assert unsafe.reuse == expected
    if before:
        assert after[unsafe.pk] != before[unsafe.pk]
        assert after[safe.pk] == before[safe.pk]


def test_catalog_rows_escape_hub_text_in_text_and_in_attributes(
    client: Client, catalog: Catalog
) -> None:
    """A row prints its summary as text and its base model (from the Hub's model card) inside a
    title attribute; the rows' Jinja2 template escapes both, quotes included."""
    HubModel.objects.filter(repo_id=HOSTILE_REPO).update(
        drift="edited",
        base_model='x"><script>alert("base")</script>',
        verdict_summary='<img src=x onerror=alert(1)> it\'s "quoted".',
        downloads=10**9,
    )
    body = client.get("/").content.decode()
    row = body.split(f'class="repo" href="/m/{HOSTILE_REPO}/"')[1].split("</tr>")[0]
    assert "<script>" not in row and "<img" not in row
    assert (
        'title="Its template differs from every version of '
        "x&#34;&gt;&lt;script&gt;alert(&#34;base&#34;)&lt;/script&gt;'s\">edited template</span>"
    ) in row
    assert "&lt;img src=x onerror=alert(1)&gt; it&#39;s &#34;quoted&#34;." in row


@settings(max_examples=200, deadline=None, database=None)
@given(
    org=st.from_regex(RepoPartConverter.regex, fullmatch=True),
    name=st.from_regex(RepoPartConverter.regex, fullmatch=True),
    prefix=st.sampled_from(["/", "/cachesafe/"]),
)
def test_model_links_are_what_the_urlconf_reverses(org: str, name: str, prefix: str) -> None:
    """Catalog rows build a model's link without the resolver; it must stay the URLconf's."""
    set_script_prefix(prefix)
    try:
        assert model_url(f"{org}/{name}") == reverse("dashboard:model", args=[org, name])
        # As the catalog's rows write it: the stem once a page, each row's path.
        assert model_url_stem() + model_path(f"{org}/{name}") == model_url(f"{org}/{name}")
    finally:
        set_script_prefix("/")


@settings(max_examples=300, deadline=None, database=None)
@given(org=st.text(min_size=1).filter(lambda s: "/" not in s), name=st.text(min_size=1))
def test_a_plain_repo_ids_path_is_what_quoting_gives(org: str, name: str) -> None:
    """A repo id that quoting would leave as it is skips quoting (`model_path`); any other
    is quoted part by part, a slash in its name too."""
    expected = f"{quote(org, safe='')}/{quote(name, safe='')}/"
    assert model_path(f"{org}/{name}") == expected
    assert model_path("Qwen/Qwen2.5-7B_Instruct.v1~x") == "Qwen/Qwen2.5-7B_Instruct.v1~x/"


def test_a_repo_id_without_a_slash_is_listed_not_an_error(client: Client) -> None:
    """The service writes none (`validate_repo_id`), but the table takes any: a row without
    a slash must not take down every page that lists it."""
    HubModel.objects.create(repo_id="noslash", author="noslash", downloads=10**9)
    page = client.get(reverse("dashboard:catalog"))
    assert page.status_code == 200
    assert 'href="/m/noslash//"' in page.content.decode()
    listed = client.get("/api/models", {"author": "noslash"})
    assert listed.status_code == 200
    assert listed.json()["results"][0]["url"] == "http://testserver/m/noslash//"
    assert client.get("/m/noslash//").status_code == 404


@pytest.mark.parametrize("prefix", ["/", "/cachesafe/"])
def test_the_frames_links_are_what_the_urlconf_and_the_static_files_give(
    prefix: str, settings: SettingsWrapper
) -> None:
    """Every page's frame (`frame`, made once per process, script prefix, URLconf, static URL
    and DEBUG) links what `{% url %}`, `{% static %}` and `{% htmx_script %}` give, under each
    script prefix, and so does the Jinja2 templates' `url()` (`fixed_url`)."""
    htmx = engines["django"].from_string("{% load django_htmx %}{% htmx_script %}")
    set_script_prefix(prefix)
    try:
        made = frame()
        page = engines["django"].get_template("base.html").render({})
        for key, name in FRAME_LINKS.items():
            assert made[key] == reverse(name) == fixed_url(name), name
            assert made[key].startswith(prefix) and f'href="{made[key]}"' in page
        for key, path in FRAME_FILES.items():
            assert made[key] == static(path) and f'"{made[key]}"' in page
        assert made["htmx"] == htmx.render({}) and made["htmx"] in page
        assert frame() is made
        settings.DEBUG = True  # django-htmx adds its debug script
        assert frame()["htmx"] == htmx.render({}) != made["htmx"]
    finally:
        set_script_prefix("/")


def test_an_author_no_feed_url_can_name_is_listed_without_the_feed_link(client: Client) -> None:
    """The author filter takes any text, and an author is what the Hub says: one no URL of
    the feeds can name gets the page and its subscribe link, not a 500."""
    HubModel.objects.create(repo_id="plain/model", author="aéb", downloads=10)
    HubModel.objects.create(repo_id="other/model", author="other", downloads=10)
    odd = client.get(reverse("dashboard:catalog"), {"author": "AéB"})
    assert odd.status_code == 200
    assert "plain/model" in odd.content.decode()
    assert "feeds/authors" not in odd.content.decode()
    assert "Subscribe to AéB" in odd.content.decode()
    plain = client.get(reverse("dashboard:catalog"), {"author": "other"})
    assert 'href="/feeds/authors/other.atom"' in plain.content.decode()


def test_a_name_starting_with_an_underscore_has_its_pages(client: Client) -> None:
    """The Hub lets a name start with '_' (and `validate_repo_id` tracks one): its model page
    and badge answer, where the URL converter refused them."""
    HubModel.objects.create(repo_id="acme/_under", author="acme")
    listed = client.get(reverse("dashboard:catalog"))
    assert 'href="/m/acme/_under/"' in listed.content.decode()
    assert client.get("/m/acme/_under/").status_code == 200
    assert client.get(reverse("dashboard:badge", args=["acme", "_under"])).status_code == 200
