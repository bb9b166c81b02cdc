"""Model, template, pair and version-diff pages; the unknown-model 404; live check progress."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries
from pytest_django.fixtures import Settings as SettingsWrapper

from registry.models import (
    CheckRun,
    HubModel,
    ModelStatus,
    NamedTemplate,
    TemplateChange,
    TemplateVersion,
    Verdict,
)
from registry.verdicts import check_in_process, record_check
from tests.conftest import REPO_ROOT
from tests.dashboard_data import (
    HOSTILE_REPO,
    PENDING_REPO,
    TOKENS,
    Catalog,
    add_model,
    build_catalog,
    healthy_service,  # noqa: F401 - a fixture
    without_default,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


def sha(model: HubModel) -> str:
    assert model.current_snapshot is not None
    return model.current_snapshot.default_template.sha256


def test_model_page_says_the_verdict_and_shows_the_evidence(
    client: Client, catalog: Catalog
) -> None:
    response = client.get(f"/m/{catalog.unsafe.repo_id}/")
    body = response.content.decode()
    assert response.status_code == 200
    assert "Breaks the cache" in body
    assert "earlier messages are re-rendered when a turn is added" in body  # the sentence
    # The matrix links each failing cell to the pair's diff, pinned to the template version.
    assert f'href="/t/{sha(catalog.unsafe)}/pair/default/chat/1/"' in body
    # Findings point at their template lines; the culprit lines are highlighted in the source.
    assert "moving_marker" in body and 'href="#L3"' in body
    assert '<tr id="L6" class="culprit">' in body
    assert '<tr id="L1">' in body  # a line that wrote nothing wrong is not highlighted
    assert "No probe yet" in body
    # Subscribing is a real link to the alerts page, prefilled for this model.
    assert f'href="/alerts/?repo_id={catalog.unsafe.repo_id}"' in body
    assert (
        f"/m/{catalog.unsafe.repo_id}/at/{catalog.unsafe.last_commit_sha}/" in body
    )  # pinned permalink


def test_model_page_shows_the_verdict_for_each_client_and_engine(
    client: Client, catalog: Catalog
) -> None:
    body = client.get(f"/m/{catalog.safe.repo_id}/").content.decode()
    grid = body.split('id="setups-h"')[1].split("</section>")[0]
    rows = re.findall(r'<tr id="client-([a-z_]+)">(.*?)</tr>', grid, re.S)
    assert [name for name, _ in rows] == [
        "typical",
        "reasoning_content",
        "thinking_chunks",
        "arguments_objects",
        "arguments_strings",
    ]
    typical = rows[0][1]
    assert "Drops reasoning" in typical
    assert typical.count("badge-safe") == 4 and "carries over" in typical  # every engine
    # ChatML never writes reasoning back: those rows say why they match the first one.
    assert "Same as the first row: the template never writes reasoning into history" in rows[1][1]
    unsafe = client.get(f"/m/{catalog.unsafe.repo_id}/").content.decode()
    unsafe_grid = unsafe.split('id="setups-h"')[1].split("</section>")[0]
    assert unsafe_grid.count("badge-unsafe") >= 4


def test_a_safe_model_has_no_breaks_section(client: Client, catalog: Catalog) -> None:
    body = client.get(f"/m/{catalog.safe.repo_id}/").content.decode()
    assert "Cache-safe in every session we replayed" in body
    assert "Where the cache breaks" not in body
    assert "culprit" not in body.split("Template source")[1].split("</section>")[0].replace(
        "culprit-key", ""
    )


def test_hybrid_model_sentence_says_what_a_divergence_costs(
    client: Client, catalog: Catalog
) -> None:
    body = client.get(f"/m/{catalog.changed.repo_id}/").content.decode()
    assert "hybrid (recurrent + attention) model" in body


def test_model_page_shows_the_template_history_with_verdicts(
    client: Client, catalog: Catalog
) -> None:
    body = client.get(f"/m/{catalog.changed.repo_id}/").content.decode()
    history = body.split('id="history-h"')[1]
    assert "Strip reasoning from earlier turns" in history
    assert "Initial chat template" in history
    diff_url = f"/t/{sha(catalog.changed)}/vs/{catalog.old_version.sha256}/"
    assert diff_url in history
    # Before: safe (the old ChatML template), after: breaks.
    change = history.split("Strip reasoning")[1].split("</li>")[0]
    assert change.index("Cache-safe") < change.index("Breaks the cache")


@pytest.mark.usefixtures("healthy_service")
def test_model_page_query_count_does_not_grow_with_history(
    client: Client,
    catalog: Catalog,
    django_assert_num_queries: DjangoAssertNumQueries,
    settings: SettingsWrapper,
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0  # count the rendering, not the page cache
    url = f"/m/{catalog.changed.repo_id}/"
    # model (+ snapshot, template, catalog row), newest check, latest probe, timeline with both
    # verdicts, named templates with theirs, models derived from it
    with django_assert_num_queries(6):
        client.get(url)
    for n in range(20):
        TemplateChange.objects.create(
            model=catalog.changed,
            commit_sha=f"{n:040x}",
            old_version=catalog.old_version,
            new_version=catalog.changed.current_snapshot.default_template,  # type: ignore[union-attr]
        )
    with django_assert_num_queries(6):
        response = client.get(url)
    assert response.content.decode().count("What changed") == 21


def test_model_pinned_to_a_commit_and_unknown_commit(client: Client, catalog: Catalog) -> None:
    pinned = client.get(f"/m/{catalog.unsafe.repo_id}/at/{catalog.unsafe.last_commit_sha}/")
    assert pinned.status_code == 200
    assert "You are looking at this model as of commit" in pinned.content.decode()
    assert client.get(f"/m/{catalog.unsafe.repo_id}/at/{'1' * 40}/").status_code == 404
    # The short id the page prints leads to the same pinned page; an unknown one is a 404.
    short = client.get(f"/m/{catalog.unsafe.repo_id}/at/{catalog.unsafe.last_commit_sha[:12]}/")
    assert short.status_code == 301
    assert short.headers["Location"] == (
        f"/m/{catalog.unsafe.repo_id}/at/{catalog.unsafe.last_commit_sha}/"
    )
    assert client.get(f"/m/{catalog.unsafe.repo_id}/at/1111111/").status_code == 404


def test_unknown_model_is_a_404_that_offers_to_track_it(client: Client, catalog: Catalog) -> None:
    response = client.get("/m/some-org/not-tracked-7b/")
    body = response.content.decode()
    assert response.status_code == 404
    assert "We do not track" in body
    assert '<form method="post" action="/track/"' in body
    assert '<input type="hidden" name="repo_id" value="some-org/not-tracked-7b">' in body


def test_a_model_being_checked_polls_its_progress_until_done(
    client: Client, catalog: Catalog
) -> None:
    url = f"/m/{PENDING_REPO}/"
    page = client.get(url).content.decode()
    assert "Checking…" in page and 'value="40"' in page
    assert 'hx-trigger="every 2s"' in page
    poll = client.get(url, headers={"HX-Request": "true", "HX-Target": "check-status"})
    fragment = poll.content.decode()
    assert fragment.lstrip().startswith('<div id="check-status"')
    assert 'hx-trigger="every 2s"' in fragment and "<html" not in fragment
    # The check finishes: the next poll answers the verdict, without a trigger, so polling stops.
    pending = HubModel.objects.get(repo_id=PENDING_REPO)
    version = pending.current_snapshot.default_template  # type: ignore[union-attr]
    record_check(version, check_in_process(version, TOKENS))
    final = client.get(url, headers={"HX-Request": "true", "HX-Target": "check-status"})
    text = final.content.decode()
    assert "hx-trigger" not in text
    assert "Show the full results" in text
    run = CheckRun.objects.get(template_version=version)
    assert run.status == "done" and run.finished_at is not None
    # The pins' "checked at" lives outside the polled block: the poll sends it out of band.
    engine = text.split('<div id="engine-line" hx-swap-oob="true">')[1].split("</div>")[0]
    assert f'<time datetime="{run.finished_at.isoformat()}"' in engine


def test_a_model_not_synced_yet_polls_too(client: Client) -> None:
    HubModel.objects.create(repo_id="new-org/just-tracked", author="new-org")
    body = client.get("/m/new-org/just-tracked/").content.decode()
    assert 'hx-trigger="every 2s"' in body
    HubModel.objects.filter(repo_id="new-org/just-tracked").update(
        status=ModelStatus.NO_TEMPLATE, status_reason="This repository has no chat template."
    )
    body = client.get("/m/new-org/just-tracked/").content.decode()
    assert "hx-trigger" not in body and "no chat template" in body


def test_hub_text_is_escaped_everywhere(client: Client, catalog: Catalog) -> None:
    """The template, its tags and family come from the Hub: none of it may become markup."""
    hostile = sha(catalog.hostile)
    pages = [
        "/",
        "/?q=evil",
        f"/m/{HOSTILE_REPO}/",
        f"/t/{hostile}/",
        f"/t/{hostile}/pair/default/chat/1/",
        f"/t/{hostile}/vs/{catalog.old_version.sha256}/",
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert "<script>alert" not in body, url
        assert "<img src=x" not in body, url
        assert "<b>fam</b>" not in body, url
    source = client.get(f"/t/{hostile}/").content.decode()
    assert "&lt;script&gt;alert(&#x27;template&#x27;)&lt;/script&gt;" in source
    assert "&lt;img src=x onerror=alert(1)&gt;" in source
    pair = client.get(f"/t/{hostile}/pair/default/chat/1/").content.decode()
    assert '<span class="tok">&lt;|im_start|&gt;</span>' in pair  # escaped, then made visible
    assert "&lt;img" in pair


def test_template_page_lists_its_models_and_verdicts(client: Client, catalog: Catalog) -> None:
    body = client.get(f"/t/{sha(catalog.changed)}/").content.decode()
    assert catalog.changed.repo_id in body
    assert "enable_thinking=true" in body
    assert client.get(f"/t/{'f' * 64}/").status_code == 404
    assert client.get("/t/not-a-sha/").status_code == 404


def test_pair_page_shows_both_renders_and_the_divergence(client: Client, catalog: Catalog) -> None:
    url = f"/t/{sha(catalog.unsafe)}/pair/default/chat/1/"
    response = client.get(url, {"model": catalog.unsafe.repo_id})
    body = response.content.decode()
    assert response.status_code == 200
    assert "Request 1" in body and "Request 2" in body
    assert body.count('id="divergence-before"') == 1
    assert body.count('id="divergence-after"') == 1
    assert 'href="#divergence-after"' in body  # the jump link works without JavaScript
    # The marker that moved: request 1 marks user 1 as latest, request 2 does not.
    before = body.split('id="divergence-before"')[1][:300]
    assert "[LATEST]" in before
    assert "byte 86" in body and "user 1" in body
    # Prompt and reply reuse told apart, and what each kind of engine cache keeps of request 2.
    assert "Prompt reuse: request 1 does not carry over" in body
    engines = body.split('class="engine-reuse"')[1].split("</table>")[0]
    assert engines.count("<tr") == 5  # a header and the four cache classes
    assert engines.count('class="lost"') == 3  # trimmable, hybrid, hybrid with checkpoints
    # No tokenizer in this catalog: blocks are counted in tokens, so the page says so.
    block = engines.split("Block cache (vLLM, SGLang)")[1].split("</tr>")[0]
    assert "needs a tokenizer" in block
    # What a turn must reuse to cost only the reply, in the pair's unit.
    assert "Needs to reuse, for the turn to cost only the reply" in engines
    trimmable = engines.split("Trimmable")[1].split("</tr>")[0]
    assert re.search(r"<td>\d+ bytes</td>$", trimmable), trimmable
    lines = body.split("The template lines that wrote the difference")[1].split("</section>")[0]
    assert "#L6" in lines and "#L7" in lines and "#L3" not in lines  # this pair's lines only
    # The latest link of this pair, and the copyable pinned link.
    latest = f"/m/{catalog.unsafe.repo_id}/pair/default/chat/1/"
    assert latest in body
    redirect = client.get(latest)
    assert redirect.status_code == 302 and redirect["Location"].startswith(url)


def test_pair_that_does_not_exist_is_404(client: Client, catalog: Catalog) -> None:
    base = f"/t/{sha(catalog.unsafe)}/pair"
    assert client.get(f"{base}/default/chat/9/").status_code == 404
    assert client.get(f"{base}/enable_thinking=true/chat/1/").status_code == 404
    assert client.get(f"{base}/default/no-session/1/").status_code == 404
    # A safe template has no failing pair to show, but a passing pair still renders.
    assert client.get(f"/t/{sha(catalog.safe)}/pair/default/chat/1/").status_code == 200


def test_version_diff_shows_changed_lines_and_both_verdicts(
    client: Client, catalog: Catalog
) -> None:
    url = f"/t/{sha(catalog.changed)}/vs/{catalog.old_version.sha256}/"
    body = client.get(url, {"model": catalog.changed.repo_id}).content.decode()
    before, after = body.split("<h2>Before</h2>")[1].split("<h2>After</h2>")
    assert "Cache-safe" in before and "Breaks the cache" in after
    assert re.search(r'<tr class="add">.*split\(&#x27;&lt;/think&gt;&#x27;\)', body)
    assert '<tr class="del">' in body
    assert client.get(f"/t/{sha(catalog.changed)}/vs/{'e' * 64}/").status_code == 404


def test_badge_is_an_svg_with_the_verdict(client: Client, catalog: Catalog) -> None:
    safe = client.get(f"/badge/{catalog.safe.repo_id}.svg")
    assert safe.status_code == 200
    assert safe["Content-Type"].startswith("image/svg+xml")
    assert "prompt cache: safe" in safe.content.decode()
    assert "breaks" in client.get(f"/badge/{catalog.unsafe.repo_id}.svg").content.decode()
    unknown = client.get("/badge/nobody/nothing.svg")
    assert unknown.status_code == 404 and "not tracked" in unknown.content.decode()


def test_feeds_of_template_changes(client: Client, catalog: Catalog) -> None:
    everything = client.get("/feeds/changes.atom")
    assert everything["Content-Type"].startswith("application/atom+xml")
    text = everything.content.decode()
    assert text.count("<entry>") == 4  # each demo model's first template, and the thinker's change
    assert "Strip reasoning from earlier turns" in text
    # A first template is added, a later one changed.
    assert text.count(": chat template added (") == 3
    assert text.count(": chat template changed (Strip reasoning from earlier turns)") == 1
    assert f"/t/{sha(catalog.changed)}/vs/{catalog.old_version.sha256}/" in text
    by_author = client.get("/feeds/authors/cachesafe-demo.atom").content.decode()
    assert by_author.count("<entry>") == 4
    # The name in any case, as the catalog's filter takes it; titled as the catalog spells it.
    any_case = client.get("/feeds/authors/CacheSafe-Demo.atom").content.decode()
    assert any_case.count("<entry>") == 4 and "changes by cachesafe-demo</title>" in any_case
    assert client.get("/feeds/authors/evil-org.atom").content.decode().count("<entry>") == 0
    assert client.get("/feeds/authors/nobody.atom").status_code == 404
    one = client.get(f"/m/{catalog.changed.repo_id}/changes.atom").content.decode()
    assert one.count("<entry>") == 2
    assert client.get("/m/nobody/nothing/changes.atom").status_code == 404


def test_a_commit_title_with_characters_xml_cannot_hold_leaves_the_feeds_readable(
    client: Client, catalog: Catalog
) -> None:
    """A commit title is the Hub's, any text: one with a control character (an escape code, a
    form feed) made every feed that listed it answer 500, since XML 1.0 cannot hold one."""
    import xml.etree.ElementTree as ElementTree

    change = TemplateChange.objects.filter(model=catalog.changed, old_version__isnull=False).get()
    TemplateChange.objects.filter(pk=change.pk).update(title="Fix \x1b[31mred\x1b[0m\x0c tools")
    author = catalog.changed.repo_id.split("/")[0]
    for url in ("/feeds/changes.atom", f"/feeds/authors/{author}.atom",
                f"/m/{catalog.changed.repo_id}/changes.atom"):  # fmt: skip
        response = client.get(url)
        assert response.status_code == 200, url
        feed = ElementTree.fromstring(response.content)  # well-formed XML
        titles = [e.text or "" for e in feed.iter("{http://www.w3.org/2005/Atom}title")]
        assert any("(Fix [31mred[0m tools)" in t for t in titles), titles


def test_pages_unfurl_with_model_and_verdict(client: Client, catalog: Catalog) -> None:
    body = client.get(f"/m/{catalog.unsafe.repo_id}/").content.decode()
    assert (
        f'<meta property="og:title" content="{catalog.unsafe.repo_id}: Breaks the cache">' in body
    )
    assert '<meta name="twitter:title"' in body
    assert re.search(r'<meta property="og:description" content="Not cache-safe', body)


def test_pages_refuse_post(client: Client, catalog: Catalog) -> None:
    assert client.post(f"/m/{catalog.unsafe.repo_id}/").status_code == 405
    assert client.post(f"/t/{sha(catalog.unsafe)}/").status_code == 405


def test_named_templates_are_listed_with_their_verdicts(
    client: Client, catalog: Catalog, django_capture_on_commit_callbacks: Any
) -> None:
    snapshot = catalog.unsafe.current_snapshot
    assert snapshot is not None
    single = client.get(f"/m/{catalog.unsafe.repo_id}/").content.decode()
    assert "Named templates" not in single  # only `default`: nothing to list
    with django_capture_on_commit_callbacks(execute=True):  # the cached page moves on at commit
        NamedTemplate.objects.create(
            snapshot=snapshot, name="tool_use", version=catalog.old_version
        )
    body = client.get(f"/m/{catalog.unsafe.repo_id}/").content.decode()
    named = body.split("<dt>Named templates</dt>")[1].split("</dd>")[0]
    assert f'href="/t/{catalog.old_version.sha256}/"><code>tool_use</code>' in named
    assert named.index("default") < named.index("Breaks the cache") < named.index("tool_use")
    assert "Cache-safe" in named.split("tool_use")[1]


def test_a_model_without_a_default_template_shows_no_template_as_its_default(
    client: Client, catalog: Catalog, django_capture_on_commit_callbacks: Any
) -> None:
    """Named `rag` and `tool_use`, none `default`: transformers renders a request without tools
    only with a template's name. The page says so with the model's verdict, over the named
    templates, and shows no template's results (its setups, matrix, source) as the default's."""
    usual = client.get(f"/m/{catalog.safe.repo_id}/").content.decode()
    headings = ("Verdict for the typical setup", "Your client × your engine", "Template source")
    assert all(heading in usual for heading in headings)
    with django_capture_on_commit_callbacks(execute=True):  # the cached page moves on at commit
        model = without_default(catalog.safe, catalog.old_version)
    assert model.verdict == Verdict.SAFE_WHERE_RENDERABLE
    body = client.get(f"/m/{model.repo_id}/").content.decode()
    panel = body.split('id="check-status"')[1].split("</dl>")[0]
    assert (
        '<span class="badge badge-big badge-safe_where_renderable">Safe where it renders' in panel
    )
    assert (
        "No default template: transformers renders a request without tools only when the caller "
        "names a template (chat_template=&quot;rag&quot; or &quot;tool_use&quot;); with tools it "
        "uses &quot;tool_use&quot;. Its “rag” template: Cache-safe"
    ) in panel
    assert not any(heading in body for heading in headings)
    assert "<dt>Template</dt><dd>none is the default" in body
    named = body.split("<dt>Named templates</dt>")[1].split("</dd>")[0]
    assert "<code>rag</code>" in named and "<code>tool_use</code>" in named
    # A summary stored before spoke for `rag` as if it were the default: not shown as such.
    with django_capture_on_commit_callbacks(execute=True):
        model.verdict_summary = "Cache-safe in every session we replayed."
        model.save(update_fields=["verdict_summary"])
    body = client.get(f"/m/{model.repo_id}/").content.decode()
    sentence = body.split('id="check-status"')[1].split('<p class="sentence">')[1]
    assert sentence.startswith("No default template: ")
    assert sentence.split("</p>")[0].endswith("it uses &quot;tool_use&quot;.")


def test_author_filter_links_to_the_author_feed(client: Client, catalog: Catalog) -> None:
    body = client.get("/", {"author": "cachesafe-demo"}).content.decode()
    assert 'href="/feeds/authors/cachesafe-demo.atom"' in body
    odd = client.get("/", {"author": "not a real/author"})
    assert odd.status_code == 200 and "/feeds/authors/" not in odd.content.decode()


def test_a_check_that_failed_says_why_and_stops_polling(client: Client, catalog: Catalog) -> None:
    CheckRun.objects.filter(template_version__sha256=sha(catalog.pending)).update(
        status="failed", error="sandbox process died (signal 9)"
    )
    body = client.get(f"/m/{PENDING_REPO}/").content.decode()
    assert "could not finish (sandbox process died (signal 9))" in body
    assert "hx-trigger" not in body


def test_pages_load_htmx_from_our_own_static_files(client: Client, catalog: Catalog) -> None:
    body = client.get("/").content.decode()
    [src] = re.findall(r'<script src="([^"]*htmx[^"]*\.js)"', body)
    assert src.startswith(settings.STATIC_URL), src  # never a CDN
    assert finders.find(src.removeprefix(settings.STATIC_URL)) is not None


def test_the_reader_chooses_a_setup_in_the_url(client: Client, catalog: Catalog) -> None:
    base = f"/m/{catalog.safe.repo_id}/"
    headline = client.get(base).content.decode()
    setup = headline.split('id="setup"')[1].split("</form>")[0]
    # No choice made: the setup most readers have, stated in words, and a form to pick theirs.
    assert "Verdict for the typical setup." in setup
    assert "A client that drops reasoning (most OpenAI-compatible clients)" in setup
    assert 'name="client"' in setup and 'name="engine"' in setup
    chosen = client.get(base, {"client": "reasoning_content", "engine": "hybrid"})
    body = chosen.content.decode()
    panel = body.split('id="setup"')[1].split("</ul>")[0]
    assert '<option value="hybrid" selected>' in panel
    assert "Cache-safe for a client that sends reasoning back as reasoning_content" in panel
    assert "a hybrid model without cache checkpoints" in panel
    # Each setting of the template is its own chip.
    assert panel.count('class="chip ') == len(
        client.get(f"/api/checks/{sha(catalog.safe)}").json()["variants"]
    )
    # An unknown value is ignored, and the page says so.
    bad = client.get(base, {"engine": "quantum"}).content.decode()
    assert "Ignored: unknown engine &#x27;quantum&#x27;" in bad
    # Said where it is seen, and the values that are known are kept.
    stale = client.get(base, {"client": "reasoning_content", "engine": "quantum"})
    panel = stale.content.decode().split('id="setup"')[1].split("</ul>")[0]
    assert '<p class="notice setup-error" role="status">Ignored: unknown engine' in panel
    assert '<option value="reasoning_content" selected>' in panel
    assert "Cache-safe for a client that sends reasoning back as reasoning_content" in panel


def test_a_setup_that_breaks_says_what_keeps_the_cache(client: Client, catalog: Catalog) -> None:
    body = client.get(f"/m/{catalog.unsafe.repo_id}/", {"engine": "hybrid"}).content.decode()
    panel = body.split('id="setup"')[1].split("</ul>")[0]
    assert "Breaks the cache for a client that drops reasoning" in panel
    assert "First break:" in panel


def test_a_model_shows_the_check_of_its_own_tokenizer_not_another_repos(client: Client) -> None:
    """A GGUF repo (no tokenizer.json) and an MLX conversion (one that could not be read) share
    a template: each page and API answer shows the run its verdict comes from, not the newest
    run of the template, which is the other repo's, with the other repo's reason."""
    from dataclasses import replace

    from checks.reports import checked_on_bytes
    from registry.models import TemplateSnapshot
    from tests.dashboard_data import add_model

    text = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}<assistant>"
    gguf = add_model("org/model-GGUF", text, commit="e" * 40)  # checked on bytes: no tokenizer
    mlx = add_model("mlx-community/model-4bit", text, commit="f" * 40, check=False)
    assert mlx.current_snapshot is not None
    TemplateSnapshot.objects.filter(pk=mlx.current_snapshot.pk).update(tokenizer_json_sha="a" * 40)
    version = gguf.current_snapshot.default_template  # type: ignore[union-attr]
    report = check_in_process(version, TOKENS)
    gated = replace(report, summary=checked_on_bytes(report.summary, "the repo is gated"))
    record_check(version, gated, tokenizer_sha="a" * 40)  # the newer run: the MLX repo's

    note = "Checked on bytes only: the repo is gated."
    for model, has_note in ((gguf, False), (mlx, True)):
        api = client.get(f"/api/models/{model.repo_id}").json()
        assert (note in api["check"]["summary"]) is has_note, model.repo_id
        page = client.get(f"/m/{model.repo_id}/").content.decode()
        assert (note in page) is has_note, model.repo_id


@pytest.mark.parametrize("newline", ["\r", "\r\n"])
def test_a_template_with_other_line_breaks_is_numbered_as_the_engine_numbers_it(
    client: Client, newline: str
) -> None:
    """Jinja breaks lines on a lone carriage return too: a template written with them was one
    line on its page, and the check's culprit lines pointed at rows that did not exist."""
    text = (REPO_ROOT / "registry/demo/moving-marker-unsafe.jinja").read_text()
    model = add_model("org-a/marker", text.replace("\n", newline), commit="a" * 40)
    assert model.current_snapshot is not None
    sha = model.current_snapshot.default_template.sha256
    failures = client.get(f"/api/checks/{sha}").json()["failures"]
    culprits = {n for failure in failures for n in failure["template_lines"]}
    body = client.get(f"/t/{sha}/").content.decode()
    assert body.count('<tr id="L') == len(text.split("\n"))
    for number in culprits:
        assert f'<tr id="L{number}" class="culprit">' in body


def test_the_version_diff_numbers_lines_as_the_template_page(client: Client) -> None:
    """A form feed inside a comment is no line break to Jinja; `splitlines` made it one."""
    old_text = "{#- header\x0cstill the comment -#}\n{{ bos_token }}\n{{ messages[0].content }}\n"
    old, _ = TemplateVersion.objects.get_or_create_for_text(old_text)
    new, _ = TemplateVersion.objects.get_or_create_for_text(
        old_text.replace("messages[0]", "messages[-1]")
    )
    assert (
        '<tr id="L3"><td class="ln"><a href="#L3">3</a></td>'
        in client.get(f"/t/{new.sha256}/").content.decode()
    )
    diff = client.get(f"/t/{new.sha256}/vs/{old.sha256}/").content.decode()
    added = diff.split('<tr class="add">')[1].split("</tr>")[0]
    assert added.startswith('<td class="ln"></td><td class="ln">3</td>'), added


def test_a_pair_page_renders_with_the_models_own_tokens_and_marks_where_they_part(
    client: Client,
) -> None:
    """The renders were kept by template and pair alone: one model's page showed another
    model's special tokens. And the check's offset, taken to renders made with other tokens,
    put the mark 14 characters early, in the previous message."""
    from registry.models import TemplateSnapshot

    text = (REPO_ROOT / "registry/demo/moving-marker-unsafe.jinja").read_text()
    first = add_model("org-a/marker", text, commit="a" * 40)  # bos_token "<s>", checked
    second = add_model("org-b/marker", text, commit="b" * 40, check=False)
    TemplateSnapshot.objects.filter(model=second).update(
        special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}
    )
    assert first.current_snapshot is not None
    url = f"/t/{first.current_snapshot.default_template.sha256}/pair/default/chat/1/"
    mark = '<mark class="div" id="divergence-before">'
    for repo_id, shown, hidden in (
        ("org-b/marker", "begin_of_text", None),
        ("org-a/marker", None, "begin_of_text"),
    ):
        page = client.get(url, {"model": repo_id}).content.decode()
        if shown:
            assert shown in page, repo_id
        if hidden:
            assert hidden not in page, repo_id
        assert page.split(mark)[1].startswith('<span class="tok">[LATEST]</span>'), repo_id


def test_characters_that_reorder_or_hide_text_are_shown_by_their_code_points(
    client: Client,
) -> None:
    """A right-to-left override in a template makes its source read otherwise than it runs
    ("Trojan Source"); the pages showed it raw. Family and commit titles are the Hub's too."""
    text = "{%- if messages[0].role == 'admin' %}{#\u202e } %}{% if false %}\u2066 #}x{% endif %}\n"
    model = add_model("org-a/bidi", text, commit="a" * 40, family="\u202efam")
    assert model.current_snapshot is not None
    version = model.current_snapshot.default_template
    TemplateChange.objects.create(
        model=model, commit_sha="d" * 40, title="\u202eharmless fix", new_version=version,
        committed_at=timezone.now(),
    )  # fmt: skip
    other, _ = TemplateVersion.objects.get_or_create_for_text(text.replace("x", "y"))
    for url in (f"/t/{version.sha256}/", f"/m/{model.repo_id}/",
                f"/t/{other.sha256}/vs/{version.sha256}/"):  # fmt: skip
        body = client.get(url).content.decode()
        assert "\u202e" not in body and "\u2066" not in body, url
        assert '<span class="ctl" title="U+202E">[U+202E]</span>' in body, url


def test_changes_dated_in_the_future_do_not_hold_the_feed(client: Client, catalog: Catalog) -> None:
    """A commit's date is whatever its author set: fifty changes dated 2099 were the whole
    feed, and a change made today never appeared."""
    import xml.etree.ElementTree as ElementTree
    from datetime import UTC, datetime

    spam = add_model("spam-org/spam", "{{ messages }} spam", commit="a" * 40, check=False)
    assert spam.current_snapshot is not None
    version = spam.current_snapshot.default_template
    TemplateChange.objects.bulk_create(
        TemplateChange(model=spam, commit_sha=f"{n:040x}", new_version=version, title="spam",
                       committed_at=datetime(2099, 1, 1, tzinfo=UTC),
                       detected_at=timezone.now() - timedelta(days=1))
        for n in range(50)
    )  # fmt: skip
    real = add_model("real-org/real", "{{ messages }} real", commit="b" * 40, check=False)
    assert real.current_snapshot is not None
    TemplateChange.objects.create(
        model=real, commit_sha="c" * 40, title="Fix tools", committed_at=timezone.now(),
        new_version=real.current_snapshot.default_template,
    )  # fmt: skip
    feed = ElementTree.fromstring(client.get("/feeds/changes.atom").content)
    atom = "{http://www.w3.org/2005/Atom}"
    entries = list(feed.iter(f"{atom}entry"))
    assert "real-org/real" in (entries[0].findtext(f"{atom}title") or "")
    # Dated when they were found, not in 2099.
    spam_dates = {e.findtext(f"{atom}updated") for e in entries[1:] if "spam-org" in (
        e.findtext(f"{atom}title") or "")}  # fmt: skip
    assert spam_dates and all(d and d < "2099" for d in spam_dates)


def test_a_render_shows_controls_and_spaces_each_once() -> None:
    """The controls' own markup must not be taken for text: shown after the spaces, their
    span's space was made a visible dot, and the page's HTML broken."""
    from dashboard.pairs import _visible

    html = _visible("a \u202eb\t<|im_end|>")
    assert html == (
        'a<span class="ws">·</span><span class="ctl" title="U+202E">[U+202E]</span>b'
        '<span class="ws">→</span><span class="tok">&lt;|im_end|&gt;</span>'
    )


def test_links_and_polls_from_a_model_page_keep_the_readers_setup(
    client: Client, catalog: Catalog
) -> None:
    """A short commit id's permanent redirect, and the check's poll and its "Show the full
    results" link, dropped `?engine=hybrid`: the page they led to judged the typical setup."""
    model = catalog.changed
    short = model.last_commit_sha[:7]
    moved = client.get(f"/m/{model.repo_id}/at/{short}/", {"engine": "hybrid"})
    assert moved.status_code == 301
    assert moved["Location"].endswith(f"/at/{model.last_commit_sha}/?engine=hybrid")
    body = client.get(f"/m/{PENDING_REPO}/", {"engine": "hybrid"}).content.decode()
    [poll] = re.findall(r'<div id="check-status" hx-get="([^"]*)"', body)
    assert poll == f"/m/{PENDING_REPO}/?engine=hybrid"


def location(response: Any) -> tuple[str, dict[str, list[str]]]:
    """A redirect's path and its query parameters."""
    assert response.status_code == 301, response.status_code
    moved = urlsplit(response["Location"])
    return moved.path, parse_qs(moved.query)


def test_a_setup_spelt_otherwise_has_the_one_address_its_links_use(
    client: Client, catalog: Catalog
) -> None:
    """`?client=typical` chose the typical setup, judged alone; the page's own links spelt it
    "" (the headline, every setting) and a chip led away from it. A typical value is the absent
    one; a setup of them alone is `?thinking=default`, and any other spelling (the form's
    three values) is sent there once, so one copy is cached."""
    base = f"/m/{catalog.changed.repo_id}/"
    for given in ({"client": "typical"}, {"engine": "trimmable", "thinking": "default"}):
        assert location(client.get(base, given)) == (base, {"thinking": ["default"]})
    form = {"client": "reasoning_content", "engine": "hybrid", "thinking": "default"}
    assert location(client.get(base, form)) == (
        base,
        {"client": ["reasoning_content"], "engine": ["hybrid"]},
    )
    page = client.get(base, {"thinking": "default"})
    assert page.status_code == 200
    body = page.content.decode()
    assert "Your setup:" in body and "Ignored" not in body
    # The default setting's chip keeps the setup chosen when another setting is.
    on = client.get(base, {"thinking": "on"}).content.decode()
    assert f'<a href="{base}?thinking=default#setup">' in on
    assert f'<a href="{base}#setup">' not in on
    # An unknown value is ignored with the note, and not redirected.
    stale = client.get(base, {"engine": "quantum", "client": "typical"})
    assert stale.status_code == 200
    assert "Ignored: unknown engine &#x27;quantum&#x27;" in stale.content.decode()


def test_a_setup_value_with_spaces_around_it_is_read_stripped(
    client: Client, catalog: Catalog
) -> None:
    """`?engine=%20hybrid` from a pasted link: the model page ignored it with a note, where the
    catalog applied it and the API refused it. Stripped, then validated exactly: the page sends
    it to its clean spelling; a value still unknown once stripped keeps the note."""
    base = f"/m/{catalog.changed.repo_id}/"
    spaced = client.get(base, {"engine": " hybrid", "thinking": "off "})
    assert location(spaced) == (base, {"engine": ["hybrid"], "thinking": ["off"]})
    body = client.get(base, {"engine": "hybrid\t"}, follow=True).content.decode()
    panel = body.split('id="setup"')[1].split("</ul>")[0]
    assert '<option value="hybrid" selected>' in panel and "Ignored" not in body
    stale = client.get(base, {"engine": " quantum", "client": "reasoning_content"})
    assert stale.status_code == 200
    assert "Ignored: unknown engine &#x27;quantum&#x27;" in stale.content.decode()


def test_a_model_in_other_letters_has_one_address(client: Client, catalog: Catalog) -> None:
    """The Hub's ids are case-insensitive, and the API found a model in any case; its page,
    badge and feed answered 404, the page offering to track what is tracked."""
    model = catalog.changed
    other = model.repo_id.upper()
    page = client.get(f"/m/{other}/", {"engine": "hybrid"})
    assert page.status_code == 301
    assert page["Location"] == f"/m/{model.repo_id}/?engine=hybrid"
    pinned = client.get(f"/m/{other}/at/{model.last_commit_sha}/")
    assert pinned["Location"] == f"/m/{model.repo_id}/at/{model.last_commit_sha}/"
    badge = client.get(f"/badge/{other}.svg").content
    assert badge == client.get(f"/badge/{model.repo_id}.svg").content
    assert b"not tracked" not in badge
    assert client.get(f"/m/{other}/changes.atom").status_code == 200
    assert client.get("/api/models/" + other).json()["repo_id"] == model.repo_id
    assert client.get("/m/nobody/none/").status_code == 404
