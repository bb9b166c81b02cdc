"""The catalog search on PostgreSQL: one trigram index on the generated `search_text` column,
used by the plan for every term; counts capped so a broad term costs no more at 100k models."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import QuerySet
from django.test import Client
from django.test.utils import CaptureQueriesContext
from pytest_django.fixtures import Settings as SettingsWrapper

from dashboard import catalog as catalog_module
from dashboard.catalog import LIST_FIELDS, CatalogQuery
from registry.models import CatalogVerdict, HubModel, ProbeStatus, search_terms

pytestmark = pytest.mark.django_db

FAMILIES = ["qwen", "llama", "mistral", "phi", "gemma", "granite"]


def many_models(count: int) -> None:
    HubModel.objects.bulk_create(
        HubModel(
            repo_id=f"org-{i % 300}/{FAMILIES[i % 6]}-chat-{i}-{i % 7 + 1}b",
            author=f"org-{i % 300}",
            family=FAMILIES[i % 6],
            model_type=FAMILIES[i % 6],
            tags=["text-generation", "conversational"],
            downloads=i,
        )
        for i in range(count)
    )
    HubModel.objects.bulk_create(
        [
            HubModel(repo_id="Zebra-Labs/Stripes-9B-GGUF", author="Zebra-Labs", downloads=5),
            HubModel(repo_id="someone/plain", author="someone", tags=["ZebraTag"], downloads=3),
        ]
    )


def analyzed_plan(rows: QuerySet[Any]) -> str:
    """PostgreSQL's plan for `rows`, the catalog table analyzed first."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
        sql, params = rows.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_search_text_holds_every_searched_field_lower_cased() -> None:
    many_models(0)
    found = list(HubModel.objects.search("ZEBRA").values_list("repo_id", flat=True))
    assert sorted(found) == ["Zebra-Labs/Stripes-9B-GGUF", "someone/plain"]  # repo id, tag
    assert list(HubModel.objects.search("stripes gguf").values_list("repo_id", flat=True)) == [
        "Zebra-Labs/Stripes-9B-GGUF"
    ]
    model = HubModel.objects.get(repo_id="someone/plain")
    model.family = "Okapi"
    model.save()
    assert HubModel.objects.search("okapi").get() == model  # kept by the database on save


def test_a_term_with_separators_matches_those_separators_only() -> None:
    """`search_text` writes `-`, `_`, `.`, `/` and `:` as letters (and those letters, where a
    model's text has them, as a character that is none of them): a term matches as before."""
    HubModel.objects.bulk_create(
        HubModel(repo_id=repo_id, author=repo_id.split("/")[0], tags=tags)
        for repo_id, tags in [
            ("org-42/Qwen2.5-7B", ["license:mit"]),
            ("org_42/qwen2-5-7b", ["license-mit"]),
            ("org.42/other", ["orgƀ42", "qwen2ƅ5"]),  # the letters themselves, in a tag
        ]
    )

    def found(q: str) -> set[str]:
        matches = set(HubModel.objects.search(q).values_list("repo_id", flat=True))
        # A walk finds each term as a scan does (`strpos`): the same models.
        scanned = HubModel.objects.search(q, scanned=True).values_list("repo_id", flat=True)
        assert set(scanned) == matches, q
        return matches

    assert found("org-42") == {"org-42/Qwen2.5-7B"}
    assert found("ORG_42") == {"org_42/qwen2-5-7b"}
    assert found("qwen2.5") == {"org-42/Qwen2.5-7B"}
    assert found("license:mit") == {"org-42/Qwen2.5-7B"}
    assert found("42/") == {"org-42/Qwen2.5-7B", "org_42/qwen2-5-7b", "org.42/other"}
    assert found("orgƀ42") == {"org.42/other"}  # the letter is not a separator's stand-in
    assert found("2-5-7b 42/q") == {"org_42/qwen2-5-7b"}
    # `LIKE`'s wildcards and escape are plain characters in a term, either way.
    HubModel.objects.create(repo_id="org-9/a_b-50%", author="org-9", tags=["back\\slash"])
    assert found("a_b") == {"org-9/a_b-50%"}
    assert found("50%") == {"org-9/a_b-50%"}
    assert found("%") == {"org-9/a_b-50%"}
    assert found("k\\") == {"org-9/a_b-50%"}  # a backslash (JSON writes it twice)
    assert found("q%n") == found("2_5") == set()


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON plan's node and every node under it."""
    return [node, *(found for child in node.get("Plans", []) for found in plan_nodes(child))]


def index_plan(rows: QuerySet[Any], options: str = "") -> dict[str, Any]:
    """PostgreSQL's JSON plan of `rows` (EXPLAIN with `options`), the catalog table analyzed
    first and sequential scans off: what the index is asked, whatever the plan's choice."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
        sql, params = rows.query.sql_with_params()
        cursor.execute("SET enable_seqscan = off")
        cursor.execute(f"EXPLAIN ({options}FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone()
        cursor.execute("RESET enable_seqscan")
    return plan[0]["Plan"]  # type: ignore[no-any-return]


def test_a_term_across_a_separator_is_found_through_its_own_trigrams() -> None:
    """pg_trgm keeps only the trigrams inside a word. With the separators as they were, "org-42"
    asked the index for those of "org" and "42", and PostgreSQL rechecked every model with a
    word starting "42" to find one organisation's (at 100,000 models, 1,869 candidates for
    275 matches); written as letters, the trigrams across them find that organisation's."""
    if connection.vendor != "postgresql":
        pytest.skip("the trigram index exists on PostgreSQL only")
    many_models(6000)  # org-0 … org-299, and names numbered 0 … 5999
    matches = HubModel.objects.search("org-42").count()
    assert matches == 20  # org-42's, not org-4's or a name's "-42…"
    plan = index_plan(HubModel.objects.search("org-42").values_list("pk"), "ANALYZE, ")
    (scan,) = [node for node in plan_nodes(plan) if node.get("Index Name")]
    assert scan["Index Name"] == "dashboard_search_text_trgm", plan
    # The names "…-chat-42…" (111 of them) share "org" and " 42" with it, not "gƀ4" and "ƀ42".
    assert scan["Actual Rows"] <= 2 * matches, plan


def test_the_plan_uses_the_trigram_index_for_a_narrow_term() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the trigram index exists on PostgreSQL only")
    many_models(6000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
        for q in ("zebra", "stripes gguf"):
            rows = CatalogQuery(q=q).models()
            sql, params = rows.query.sql_with_params()
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "dashboard_search_text_trgm" in plan, plan
            assert "Seq Scan on registry_hubmodel" not in plan, plan


def test_a_broad_search_counts_up_to_the_cap(
    client: Client, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    many_models(30)
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 10)
    with_filter = {"q": "chat", "hybrid": "no"}  # one every model passes
    body = client.get("/", with_filter).content.decode()
    assert "10+ models matching" in body  # counted unordered, up to the cap
    body = client.get("/", {"q": "zebra"}).content.decode()
    assert "2 models matching" in body
    with CaptureQueriesContext(connection) as queries:
        client.get("/", with_filter)
    (keys,) = [q["sql"] for q in queries.captured_queries if "LIMIT 11" in q["sql"].upper()]
    # Unordered, the key and where the scan found it: sorted, PostgreSQL walks the downloads
    # index instead.
    assert "ORDER BY" not in keys.upper(), keys
    block = ', (("registry_hubmodel".ctid::text::point)[0]::bigint) AS "rawsql1"'
    if connection.vendor != "postgresql":
        block = ""
    assert keys.startswith(f'SELECT "registry_hubmodel"."id" AS "pk"{block} FROM'), keys
    # The search alone, which nearly every model matches, walks its order instead (on
    # PostgreSQL, where the covering indexes and the sample are), past the cap to the end of
    # its first page of 50: that walk is its count.
    with CaptureQueriesContext(connection) as queries:
        body = client.get("/", {"q": "chat"}).content.decode()
    assert "10+ models matching" in body
    sql = [q["sql"] for q in queries.captured_queries]
    searches = [q for q in sql if "LIKE" in q.upper() or "STRPOS" in q]
    if connection.vendor == "postgresql":
        (walk,) = searches
        assert "ORDER BY" in walk and walk.endswith("LIMIT 51 OFFSET 0"), walk
    else:
        assert any(sql.upper().endswith("LIMIT 11") for sql in searches), searches


def test_bases_and_derivatives_are_found_through_an_index() -> None:
    """A base page lists the models whose card names it; a derivative's sync and page look up
    the base its card names, as a pasted repo id and an API path are looked up: each
    case-insensitively, each through an index (a sequential scan took 74 ms at 100,000)."""
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    many_models(6000)
    lookups = {
        "hubmodel_base_model_upper": HubModel.objects.filter(base_model__iexact="Qwen/Qwen3-8B"),
        # As `.first()` asks: ordered by repo id, one row (the repo id index is the trap).
        "hubmodel_name_order": HubModel.objects.filter(repo_id__iexact="qwen/QWEN3-8B")[:1],
        # The catalog filtered by one author, in any case.
        "hubmodel_author_upper": CatalogQuery(author="zebra-labs").models(),
    }
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
        for index, rows in lookups.items():
            sql, params = rows.query.sql_with_params()
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert index in plan and "Seq Scan on registry_hubmodel" not in plan, plan


@pytest.mark.parametrize(
    ("order", "index"), [("changed", "hubmodel_changed_order"), ("reuse", "hubmodel_reuse_order")]
)
def test_a_broad_search_in_a_nullable_order_walks_an_index_in_that_order(
    order: str, index: str
) -> None:
    """Sorted by last template change or by prompt reuse (nulls last, then repo id), a broad
    search walks an index in exactly that order (registry migrations 0015 and 0016) and stops
    at the page: with the date alone indexed, every match without a date was read to be sorted
    by repo id (109 ms for "mistral" at 100,000 models); with the reuse figure on the catalog
    row, every match was joined to its row and sorted (40.6 ms)."""
    if connection.vendor != "postgresql":
        pytest.skip("the index exists on PostgreSQL only")
    many_models(6000)
    day = datetime(2026, 1, 1, tzinfo=UTC)
    # One model in ten without a date or a figure (not checked yet); the rest with ties.
    for step in range(10):
        HubModel.objects.filter(downloads__gte=step * 600, downloads__lt=(step + 1) * 600).update(
            last_template_change_at=day + timedelta(days=step) if step else None,
            reuse=step / 10 if step else None,
        )
    plan = analyzed_plan(CatalogQuery(q="chat", sort=order).models()[:51])
    assert index in plan, plan
    assert "Sort" not in plan, plan


@pytest.mark.parametrize(
    ("order", "index"),
    [
        ("downloads", "hubmodel_downloads_order"),
        ("reuse", "hubmodel_reuse_order"),
        ("changed", "hubmodel_changed_order"),
        ("name", "hubmodel_name_order"),
    ],
)
def test_a_search_alone_walks_its_orders_index_without_the_table(order: str, index: str) -> None:
    """A search alone (its terms, no filter) walks the index of its order, which holds each
    model's searched text (registry migration 0019): an index-only scan, with the terms tested
    on the index's copy. Through the table each model walked cost about 2 µs at 100,000
    models, through the index alone about 0.7."""
    if connection.vendor != "postgresql":
        pytest.skip("the covering indexes are PostgreSQL's")
    many_models(6000)
    plan = analyzed_plan(CatalogQuery(q="chat", sort=order).keys_in_order()[:201])
    assert f"Index Only Scan using {index} on registry_hubmodel" in plan, plan
    assert "Sort" not in plan and "search_text" in plan, plan
    # The walk's rows, read by key in the same statement: the walk is the same.
    sql, params = catalog_module.search_statement("walked rows", order, (catalog_module.TEXT,))
    values: dict[str, Any] = catalog_module.term_values(search_terms("chat"))
    values |= {catalog_module.KEYS_LIMIT: 51, catalog_module.KEYS_OFFSET: 0}
    with connection.cursor() as cursor:
        bound = [values.get(p, p) if isinstance(p, str) else p for p in params]
        cursor.execute(f"EXPLAIN {sql}", [*bound, 51, 0])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"Index Only Scan using {index} on registry_hubmodel" in plan, plan
    assert "Index Scan using registry_hubmodel_pkey" in plan, plan


@pytest.mark.parametrize("order", sorted(catalog_module.SORTED_READ))
def test_a_search_reads_the_statements_kept_for_its_shape(order: str) -> None:
    """A search with no filter runs statements kept for its order and the kinds of its terms
    (`search_statement`): its first keys, its sorted read (with its page's rows), its listing
    and (with no word among its terms) its walk (and the walk's rows) each give what the ORM's
    query of that search gives, for any
    terms (`LIKE`'s wildcards and escape among them, words of one or two letters, none), each
    asked of the trigram index whole, by the part the catalog picks (`index_parts`) or by
    another part of it; a search of other terms of the same kinds runs the same statements."""
    if connection.vendor != "postgresql":
        pytest.skip("the kept statements are PostgreSQL's")
    mixed_catalog()
    HubModel.objects.create(repo_id="org-9/qwen_x-50%", author="org-9", tags=["a\\b", "7b"])
    catalog_module.search_statement.cache_clear()
    kept, read_kept = catalog_module.search_statement, catalog_module.read_kept
    searches = ["qwen", "org-1", "qwen_x", "50%", "%", "a\\b", "ORG qwen-1", "nothing"]
    searches += ["7b", "q", "7b qwen", "qwen 7b", "zz", ""]
    shapes = set()
    for q in searches:
        query = CatalogQuery(q=q, sort=order)
        terms = search_terms(q)
        in_order = list(query.models().values_list("pk", flat=True))
        listed = list(query.models().values_list(*LIST_FIELDS))
        middles = tuple(None if word or len(term) < 5 else term[1:-1] for term, word in terms)
        for parts in ((), catalog_module.index_parts(terms), middles):
            kinds = catalog_module.term_kinds(terms, parts)
            values = catalog_module.term_values(terms, parts)
            shapes.add(kinds)

            def run(read: str, *tail: int, kinds: Any = kinds, values: Any = values) -> list[Any]:
                return read_kept(kept(read, order, kinds), values, *tail)

            assert run("listing", 1000, 0) == listed, (q, parts)
            assert run("listing", 12, 7) == listed[7:19], (q, parts)
            if catalog_module.WORD not in kinds:
                assert [pk for (pk,) in run("walk", 1000, 0)] == in_order, (q, parts)
                assert [pk for (pk,) in run("walk", 12, 7)] == in_order[7:19], (q, parts)
                walked = {**values, catalog_module.KEYS_LIMIT: 12, catalog_module.KEYS_OFFSET: 7}
                rows = run("walked rows", 12, 0, values=walked)
                assert rows == listed[7:19], (q, parts)
            found = query.models().order_by().values_list("pk", catalog_module.BLOCK)
            assert sorted(run("found", 1000)) == sorted(found), (q, parts)
            assert len(run("found", 3)) == min(3, len(in_order)), (q, parts)
            page: dict[str, int] = {catalog_module.KEYS_LIMIT: 12, catalog_module.KEYS_OFFSET: 7}
            page[catalog_module.SORT_MOST] = 999
            read = run("sorted rows", 12, 0, values={**values, **page})
            assert {row[-1] for row in read} == {len(in_order)}, (q, parts)
            assert [row[:-1] for row in read if row[0] is not None] == listed[7:19], (q, parts)
            # Read no further than the limit; past it, no row is read.
            page |= {catalog_module.SORT_MOST: 4}
            read = run("sorted rows", 12, 0, values={**values, **page})
            assert [row[-1] for row in read] == [min(5, len(in_order))], (q, parts)
            assert all(row[:-1] == (None,) * len(LIST_FIELDS) for row in read), (q, parts)
    text = (catalog_module.TEXT,)
    assert [
        HubModel.objects.get(pk=pk).repo_id
        for pk, _ in read_kept(
            kept("found", order, text), catalog_module.term_values([("50%", False)]), 5
        )
    ] == ["org-9/qwen_x-50%"]
    # A shape's statements, not a search's: found, sorted rows and listing for each, and the
    # walk and its rows for each without a word.
    walks = sum(1 for kinds in shapes if catalog_module.WORD not in kinds)
    assert kept.cache_info().currsize == 3 * len(shapes) + 2 * walks
    assert (catalog_module.PART,) in shapes and (catalog_module.TEXT,) in shapes


def test_a_term_asks_the_trigram_index_for_its_rare_part() -> None:
    """A term whose trigrams at either end most of the catalog holds asks the trigram index
    for the rest of it (`index_part`), and each candidate is tested for the whole term: the
    same matches as the whole term asked of the index, from fewer trigram lists."""
    if connection.vendor != "postgresql":
        pytest.skip("the trigram index exists on PostgreSQL only")
    many_models(6000)  # every repo id "org-N/…", every tag list "text-generation", …
    terms = search_terms("org-42")
    assert catalog_module.index_parts(terms) == ("gƀ42",)  # "org", "rgƀ" in every model
    # A term no end of which is common, a word, and a term with a character pg_trgm splits
    # words at, ask for themselves.
    assert catalog_module.index_parts(search_terms("stripes 7b a+b")) == (None, None, None)
    sample = catalog_module.search_sample()
    assert sample.holding("rgƀ") >= catalog_module.COMMON_TRIGRAM > sample.holding("gƀ4")
    # Every trigram of it in every model: one list, not twelve, for the same candidates.
    assert catalog_module.index_part("conversational", sample) == "nal"
    assert catalog_module.index_part("org", sample) is None  # one trigram: nothing to drop
    rows = HubModel.objects.having(terms, parts=("gƀ42",)).values_list("pk")
    assert set(rows) == set(HubModel.objects.search("org-42").values_list("pk"))
    assert rows.count() == 20
    plan = index_plan(rows)
    (scan,) = [node for node in plan_nodes(plan) if node.get("Index Name")]
    assert scan["Index Name"] == "dashboard_search_text_trgm", plan
    assert "gƀ42" in scan["Index Cond"] and "orgƀ42" not in scan["Index Cond"], plan
    assert any("strpos" in node.get("Filter", "") for node in plan_nodes(plan)), plan


def test_a_short_term_matches_the_start_of_a_word_through_the_word_index() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the word index exists on PostgreSQL only")
    many_models(6000)
    HubModel.objects.bulk_create(
        [
            HubModel(repo_id="acme/Okapi-27B", author="acme", downloads=1),
            HubModel(repo_id="acme/okapi-7b-zq", author="acme", downloads=1),
            HubModel(repo_id="acme/Q2-tiny", author="acme", tags=["ZqTag"], downloads=1),
        ]
    )

    def found(q: str) -> set[str]:
        return set(HubModel.objects.search(q).values_list("repo_id", flat=True))

    assert found("zq") == {"acme/okapi-7b-zq", "acme/Q2-tiny"}  # a word, and a tag's start
    assert "acme/Okapi-27B" not in found("7b")  # inside a word: not a match for 2 characters
    assert "acme/okapi-7b-zq" in found("7b")
    assert found("okapi 7b") == {"acme/okapi-7b-zq"}  # mixed with a trigram term
    assert found("q2") == {"acme/Q2-tiny"}
    assert "acme/Q2-tiny" in found("q")
    # A short term that is not letters and digits still matches anywhere, as before.
    assert found("-z") == {"acme/okapi-7b-zq"}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
        sql, params = CatalogQuery(q="zq").models().query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "dashboard_search_words_gin" in plan, plan
    assert "Seq Scan on registry_hubmodel" not in plan, plan


def test_under_the_cap_a_page_is_read_through_the_search_index(
    client: Client, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL can guess that 2% of the catalog matches a rare word (the search benchmark's
    "zq" at 100,000 models) and then walks the downloads index through every model to fill a
    page: 70 ms there, against 0.4 ms through the word index. So a search under the count's
    cap reads its page by the keys its count found, without searching again; a broad one
    walks its order, which finds its matches early, with the keys alone, then reads the page's
    rows by key: to the page's rows and no further, uncounted, when the sample holds more
    matches than the cap."""
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 100)
    many_models(300)
    HubModel.objects.bulk_create(
        HubModel(repo_id=f"Zebra-Labs/Stripes-9B-v{i}", author="Zebra-Labs", downloads=i)
        for i in range(20)
    )
    # "chat" matches nearly every model, so past the cap its page walks, judged from the
    # table's statistics (`CappedPaginator.sorts`): this table's, not earlier tests'.
    monkeypatch.setattr(catalog_module, "_table", [])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
    # The sample every model, so that "chat" is judged broad whatever the table's length.
    monkeypatch.setattr(catalog_module, "SAMPLE_BLOCKS", 10**6)
    listing = "ORDER BY"  # the page's queries (the count's is unordered)
    fetches = {}
    for term in ("9b", "chat"):
        with CaptureQueriesContext(connection) as queries:
            body = client.get("/", {"q": term}).content.decode()
        fetches[term] = [q["sql"] for q in queries.captured_queries if listing in q["sql"]]
        assert ("100+ models" in body) == (term == "chat")
        counted = [q for q in queries.captured_queries if "LIMIT 101" in q["sql"]]
        assert bool(counted) == (term == "9b")  # (a count reads the cap's keys and one more)
    assert "21 models matching" in client.get("/", {"q": "9b"}).content.decode()
    (rows,) = fetches["9b"]
    assert '"registry_hubmodel"."id" = ANY(' in rows
    assert "search_words" not in rows and "LIKE" not in rows
    (walked,) = fetches["chat"]  # the walk's keys and their rows: one statement
    assert "STRPOS" in walked and "LIKE" not in walked
    assert '"registry_hubmodel"."id" = ANY(ARRAY(SELECT' in walked
    assert "LIMIT 51 OFFSET 0))) ORDER BY" in walked and walked.endswith("LIMIT 51 OFFSET 0")
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {rows}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan Backward" not in plan, plan


def test_the_matches_are_estimated_from_where_the_scan_found_them() -> None:
    """PostgreSQL reads a table's blocks in order: a bitmap scan from the first, a sequential
    scan from where the last one stopped, wrapping at the end. The first keys of a search span
    about their share of the table; in any other order (an index scan) there is no estimate."""
    estimate = catalog_module.matches_estimate
    assert estimate(list(range(0, 100, 10)), 1000) == pytest.approx(10 * 1000 / 91)
    assert estimate([5, 5, 6, 7], 100) == pytest.approx(4 * 100 / 3)  # rows of one block
    # A sequential scan that began at block 950 of 1,000 and wrapped: it read 100 blocks.
    assert estimate([950, 980, 999, 0, 20, 49], 1000) == pytest.approx(6 * 1000 / 100)
    assert estimate([40, 10, 30, 20], 1000) is None  # an index's order
    assert estimate([900, 100, 950], 1000) is None  # wrapped past where it began
    assert estimate([50, 60, 10, 20], 1000) is not None
    assert estimate([3], 1000) is None
    assert estimate([1, 2], 0) is None


def mixed_catalog() -> None:
    """600 models over 30 organisations, with many equal downloads, change dates and reuse
    figures, models without a date or a figure and repo ids of mixed case: ties and nulls are
    where two ways of reading a page could disagree."""
    day = datetime(2026, 1, 1, tzinfo=UTC)
    HubModel.objects.bulk_create(
        HubModel(
            repo_id=f"{['Org', 'org', 'ORG'][i % 3]}-{i % 30}/{FAMILIES[i % 6]}-{i}",
            author=f"org-{i % 30}",
            family=FAMILIES[i % 6],
            downloads=i % 7 * 10,
            last_template_change_at=None if i % 4 == 0 else day + timedelta(days=i % 5),
            reuse=None if i % 5 == 0 else i % 3 / 4,
        )
        for i in range(600)
    )


@pytest.mark.parametrize("order", sorted(catalog_module.SORTS))
def test_rows_read_by_key_are_the_rows_the_orm_reads(order: str) -> None:
    """A page's rows read by key from the statement kept for its shape (`keyed_statement`:
    the keys one array) are the rows, values and order the ORM's query for those keys reads,
    with a reader's setup and without, for models with a catalog row and without one, whole
    and sliced; and a new search term reads them with the statement already kept."""
    if connection.vendor != "postgresql":
        pytest.skip("the kept statement is PostgreSQL's (= ANY of an array)")
    mixed_catalog()
    models = list(HubModel.objects.order_by("pk"))
    CatalogVerdict.objects.bulk_create(
        CatalogVerdict(
            model=model,
            thinking_on="safe" if i % 2 else "unsafe",
            probe=ProbeStatus.NONE,
            setups={"off": {"reasoning_content": {"block": ["safe", "unsafe"][i % 2]}}},
        )
        for i, model in enumerate(models)
        if i % 3  # a third without a catalog row yet
    )
    keys = [model.pk for model in models[::-1]]  # no order of their own
    catalog_module.keyed_statement.cache_clear()
    for query in (
        CatalogQuery(q="qwen", sort=order),
        CatalogQuery(
            q="org-3", sort=order, client="reasoning_content", engine="block", thinking="off"
        ),
    ):
        read = query.rows_by_key(keys)
        assert read == list(query.by_keys(keys).values_list(*query.columns))
        assert len(read) == len(keys)
        assert query.rows_by_key(keys, 30, 80) == read[30:80]
        assert query.rows_by_key(keys[:3], 5, 10) == []
    verdicts = [row[-1] for row in read]
    assert verdicts.count("safe") and verdicts.count("unsafe") and verdicts.count(None)
    statements = catalog_module.keyed_statement.cache_info()
    assert (statements.misses, statements.currsize) == (2, 2)
    expected = list(CatalogQuery(sort=order).by_keys(keys[:2]).values_list(*LIST_FIELDS))
    with CaptureQueriesContext(connection) as queries:
        assert CatalogQuery(q="other", sort=order).rows_by_key(keys[:2]) == expected
    assert catalog_module.keyed_statement.cache_info().misses == 2
    assert "= ANY(" in queries.captured_queries[0]["sql"]


@pytest.mark.parametrize("order", sorted(catalog_module.SORTED_READ))
def test_a_capped_page_is_the_same_walked_or_sorted(
    monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """Past the cap a page in one of the model's own orders either walks that order's index or
    sorts every match: each page holds the same rows in the same order both ways, as the
    catalog's order (`SORTS`) has them; past the matches it may read (`sort_limit`) the
    sorted read gives way to the walk."""
    if connection.vendor != "postgresql":
        pytest.skip("the sorted read is PostgreSQL's")
    mixed_catalog()
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 20)
    query = CatalogQuery(q="qwen", sort=order)  # 100 models
    past_cap = catalog_module.CappedPaginator.past_cap
    ranked = HubModel.objects.search("qwen").order_by(*catalog_module.SORTS[order])
    expected = list(ranked.values_list("repo_id", flat=True))
    assert len(expected) == 100

    def pages(
        sort: bool, query: CatalogQuery = query, most: int = catalog_module.SORT_CAP
    ) -> tuple[list[str], list[str]]:
        limit = most if sort else None
        monkeypatch.setattr(catalog_module.CappedPaginator, "sort_limit", lambda self, top: limit)
        # Counted first: not walked to the cap at once, nor uncounted, as the search alone
        # would be below.
        monkeypatch.setattr(catalog_module, "WALK_ALONE_SHARE", 2.0)
        monkeypatch.setattr(catalog_module.CappedPaginator, "past_cap", False)
        shown, sql = [], []
        for number in range(1, 5):
            paginator = catalog_module.CappedPaginator(query, 30)
            with CaptureQueriesContext(connection) as queries:
                page = paginator.page(number)
            shown += [row.repo_id for row in page]
            sql += [q["sql"] for q in queries.captured_queries]
            assert page.has_next() == (number < 4)
        return shown, sql

    walked, walk_sql = pages(False)
    sorted_, sort_sql = pages(True)
    assert walked == sorted_ == expected
    assert not any("MATERIALIZED" in sql for sql in walk_sql)
    assert sum("MATERIALIZED" in sql for sql in sort_sql) == 4
    # A filter on the joined catalog row (none here: "no probe yet" matches them all) reads
    # the same matches, joined inside the sorted read.
    joined = CatalogQuery(q="qwen", probe=ProbeStatus.NONE, sort=order)
    walked, _ = pages(False, joined)
    sorted_, sort_sql = pages(True, joined)
    assert walked == sorted_ == expected
    assert any("MATERIALIZED" in sql and "JOIN" in sql for sql in sort_sql)
    walked_after_all, sql = pages(True, most=99)  # more matches than it reads
    assert walked_after_all == expected
    assert sum("MATERIALIZED" in q for q in sql) == 4  # tried, then walked
    # The search alone, one model in six: walked to the cap at once on its order's covering
    # index, which is its count; each page's rows read by key, in the same order.
    monkeypatch.setattr(catalog_module, "WALK_ALONE_SHARE", 1 / 16)
    # The sample every model: earlier tests' rolled-back rows left the table thousands of
    # blocks long, and 100 of them might hold none of these 600 (then nothing is walked).
    monkeypatch.setattr(catalog_module, "SAMPLE_BLOCKS", 10**6)
    monkeypatch.setattr(catalog_module, "_sample", [])
    shown, walks = [], []
    for number in range(1, 5):
        paginator = catalog_module.CappedPaginator(replace(query, page=str(number)), 30)
        with CaptureQueriesContext(connection) as queries:
            page = paginator.get_page(str(number))
        assert paginator.walked is not None and paginator.capped
        assert page.has_next() == (number < 4)
        shown += [row.repo_id for row in page]
        walks += [q["sql"] for q in queries.captured_queries if "STRPOS" in q["sql"]]
    assert shown == expected
    assert len(walks) == 4 and all("ORDER BY" in sql and "ctid" not in sql for sql in walks)
    # To the page asked for: past the cap (20 here) from the first page of 30.
    limits = [sql.rsplit("LIMIT", 1)[1].split() for sql in walks]
    assert limits == [[str(n), "OFFSET", "0"] for n in (31, 61, 91, 121)]
    # The sample holds every model, 100 of them matches: past the cap for sure. Each page walks
    # to its own rows, uncounted; the last one, short, has counted them all (past the cap).
    monkeypatch.setattr(catalog_module.CappedPaginator, "past_cap", past_cap)
    shown, walks = [], []
    for number in range(1, 5):
        paginator = catalog_module.CappedPaginator(replace(query, page=str(number)), 30)
        with CaptureQueriesContext(connection) as queries:
            page = paginator.get_page(str(number))
        assert paginator.past_cap and paginator.walked is None
        assert paginator.capped and page.has_next() == (number < 4)
        assert not any(q["sql"].endswith("LIMIT 21") for q in queries.captured_queries)
        shown += [row.repo_id for row in page]
        walks += [q["sql"] for q in queries.captured_queries if "STRPOS" in q["sql"]]
    assert shown == expected
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 200)
    assert not catalog_module.CappedPaginator(query, 30).past_cap  # 100: no floor past 200
    # A sample that says more than there are (one read before most of them were deleted): the
    # last page's short walk counts them, under the cap, and the pager says so.
    stale = catalog_module.SearchSample(("qwen",) * 500, tuple(range(500)), fraction=1.0)
    monkeypatch.setattr(catalog_module, "_sample", [(time.monotonic(), stale)])
    paginator = catalog_module.CappedPaginator(replace(query, page="4"), 30)
    page = paginator.get_page("4")
    assert paginator.past_cap and not paginator.capped and paginator.count == 100
    assert paginator.num_pages == 4 and not page.has_next() and len(page) == 10
    assert [row.repo_id for row in page] == expected[90:]
    # The walk's own limit and offset (the rows' are the statement's last: 31 from 0).
    limits = [sql.split("LIMIT")[-2].replace(")", " ").split()[:3] for sql in walks]
    assert limits == [["31", "OFFSET", str(n)] for n in (0, 30, 60, 90)]


def test_a_term_of_a_few_hundred_is_sorted_and_a_broad_one_walked(
    client: Client, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a filter (one every model passes here), the catalog picks the plan from the blocks
    its count's scan found the keys in: an organisation's 20 models of 6,000 would walk about
    3,300 models to fill a page of 10, so they are read by key and sorted; "chat" fills a page
    at once, and walks."""
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 10)
    monkeypatch.setattr(catalog_module, "_table", [])  # this test's table, not an earlier one's
    with connection.cursor() as cursor:
        # A table without the dead rows earlier tests left at its start (rolled back), which
        # would count as blocks the scan had to cross (`matches_estimate`).
        cursor.execute("TRUNCATE registry_hubmodel CASCADE")
    many_models(6000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
    for term, sorts in (("org-7/", True), ("chat", False)):
        paginator = catalog_module.CappedPaginator(CatalogQuery(q=term, hybrid="no"), 10)
        assert paginator.capped and paginator.walked is None
        if sorts:
            blocks = [block for _, block in paginator.found]
            table, _ = catalog_module.table_blocks()
            assert 10 <= catalog_module.matches_estimate(blocks, table) <= 40  # type: ignore[arg-type,operator]
        assert (paginator.sort_limit(11) is not None) is sorts, term
        with CaptureQueriesContext(connection) as queries:
            body = client.get("/", {"q": term, "hybrid": "no"}).content.decode()
        assert any("MATERIALIZED" in q["sql"] for q in queries.captured_queries) is sorts
        expected = HubModel.objects.search(term).order_by("-downloads", "repo_id")
        for repo_id in expected.values_list("repo_id", flat=True)[:10]:
            assert repo_id in body


def test_a_search_the_sample_says_is_rare_is_read_sorted_at_once(
    client: Client, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search that the catalog's sample says few models match reads its page sorted from
    every match in one query, which also counts them: no count first, so the trigram index is
    read once. Past the matches it may sort it walks, and the process remembers that search."""
    if connection.vendor != "postgresql":
        pytest.skip("the sample and the sorted read are PostgreSQL's")
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    monkeypatch.setattr(catalog_module, "_table", [])
    monkeypatch.setattr(catalog_module, "_more_than", {})
    monkeypatch.setattr(catalog_module, "SAMPLE_BLOCKS", 10**6)  # every model: no chance
    monkeypatch.setattr(catalog_module, "_sample", [])
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE registry_hubmodel CASCADE")
    many_models(6000)  # 20 models an organisation
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
    assert catalog_module.search_sample().models == 6002

    def rare(q: str, most: int) -> bool:
        share = catalog_module.sampled_share([t for t, _ in search_terms(q)])
        return catalog_module.looks_rare(share, most, 6000)

    # 20 of 6,002 in the sample: read as (20 + 1) / 6,004 of the 6,000 models, 20.99.
    assert rare("org-7/", 21)
    assert not rare("org-7/", 20)
    assert not rare("chat", 200)
    assert search_terms("zq") == [("zq", True)]  # a word's start: never sampled
    assert catalog_module.CappedPaginator(CatalogQuery(q="zq"), 10).rare is None
    expected = list(
        HubModel.objects.search("org-7/")
        .order_by("-downloads", "repo_id")
        .values_list("repo_id", flat=True)
    )
    assert len(expected) == 20

    def read(q: str, page: str = "1") -> tuple[list[str], list[str], str]:
        with CaptureQueriesContext(connection) as queries:
            body = client.get("/", {"q": q, "page": page}).content.decode()
        sql = [q["sql"] for q in queries.captured_queries]
        return sql, [s for s in sql if "ctid" in s], body

    for cap, counted in ((10, "10+ models"), (30, "20 models")):  # past the cap, and under it
        monkeypatch.setattr(catalog_module, "COUNT_CAP", cap)
        sql, counts, body = read("org-7/")
        assert counted in body
        assert not counts  # no count first
        assert sum("MATERIALIZED" in s for s in sql) == 1
        assert not any("= ANY('{" in s for s in sql)  # its rows read in the same statement
        positions = [body.index(f">{repo_id}</a>") for repo_id in expected[:20]]
        assert positions == sorted(positions)  # the catalog's order
    # Page 5 of a search with two pages of 10: the last page, sorted.
    paginator = catalog_module.CappedPaginator(CatalogQuery(q="org-7/", page="5"), 10)
    page = paginator.get_page("5")
    assert page.number == 2 and [row.repo_id for row in page] == expected[10:]

    # The sample can miss a broad search: it sorts no more than it may, then walks.
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 10)
    monkeypatch.setattr(catalog_module, "looks_rare", lambda share, most, models: True)
    paginator = catalog_module.CappedPaginator(CatalogQuery(q="chat"), 10)
    assert paginator.capped and paginator.rare is not None
    assert paginator.rare.matches == paginator.rare.most + 1
    assert paginator.rare.rows == []  # more than it may sort: no row read
    # Its limit is priced against the walk through the table, though this search alone walks
    # its covering index for less: let go, it would be counted first, and that comes on top.
    table, per_block = catalog_module.table_blocks()
    assert paginator.alone and paginator.walk_ms == catalog_module.WALK_MS_PER_KEY
    assert paginator.rare.most == int(catalog_module.break_even(11, table * per_block))
    chat = HubModel.objects.search("chat").order_by("-downloads", "repo_id")
    assert [row.repo_id for row in paginator.page(1)] == list(
        chat.values_list("repo_id", flat=True)[:10]
    )
    assert catalog_module.CappedPaginator(CatalogQuery(q="chat"), 10).rare is None  # learned


def test_the_walk_and_the_sorted_read_cost_the_same_at_the_break_even() -> None:
    """`break_even` is where the two costs meet: fewer matches sort for less, more walk for
    less; it grows with the page's depth and the catalog."""
    for top, models in ((11, 6_000.0), (51, 100_000.0), (101, 100_000.0), (1001, 100_000.0)):
        even = catalog_module.break_even(top, models)

        def sort_ms(m: float) -> float:
            return catalog_module.SORT_MS + catalog_module.SORT_MS_PER_MATCH * m

        def walk_ms(m: float, top: int = top, models: float = models) -> float:
            return catalog_module.WALK_MS_PER_MODEL * top * models / m

        assert sort_ms(even) == pytest.approx(walk_ms(even))
        assert sort_ms(even * 0.9) < walk_ms(even * 0.9)
        assert sort_ms(even * 1.1) > walk_ms(even * 1.1)
    assert 1_200 < catalog_module.break_even(51, 100_000) < 1_300
    assert catalog_module.break_even(101, 100_000) > catalog_module.break_even(51, 100_000)
    assert catalog_module.break_even(51, 100_000) > catalog_module.break_even(51, 10_000)


def test_a_low_estimate_reads_no_further_than_the_break_even_then_walks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Matches sparse at the table's start and dense at its end (as rows a sync rewrote end
    up): the count's keys cross most of the table, so the estimate is a fraction of the
    truth and the page tries the sorted read. It reads no more matches than the number where
    the walk becomes cheaper, then walks, and the page is still the catalog's order. The
    process remembers it: the same search's next pages, in any order, walk at once, until
    the table's size is read again. With a filter (here one every model passes), as a search
    alone walks its order's covering index at a third of the cost a model (`walked`)."""
    if connection.vendor != "postgresql":
        pytest.skip("the sorted read is PostgreSQL's")
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 10)
    monkeypatch.setattr(catalog_module, "_table", [])
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE registry_hubmodel CASCADE")
    rows = [
        HubModel(
            repo_id=f"org-{i % 300}/{'okapi' if i % 300 == 0 else 'plain'}-{i}",
            author=f"org-{i % 300}",
            downloads=i % 97,
        )
        for i in range(3_600)  # 12 sparse matches, one every 300 models
    ]
    rows += [HubModel(repo_id=f"dense/okapi-{i}", downloads=i % 89) for i in range(1_000)]
    HubModel.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
    paginator = catalog_module.CappedPaginator(CatalogQuery(q="okapi", hybrid="no"), 10)
    assert paginator.capped
    table, per_block = catalog_module.table_blocks()
    blocks = [block for _, block in paginator.found if block is not None]
    estimate = catalog_module.matches_estimate(blocks, table)
    assert estimate is not None and estimate < 40  # 1,012 match
    most = paginator.sort_limit(11)
    assert most == int(catalog_module.break_even(11, table * per_block)) < 100
    with CaptureQueriesContext(connection) as queries:
        page = paginator.page(1)
    sorted_reads = [q["sql"] for q in queries.captured_queries if "MATERIALIZED" in q["sql"]]
    assert len(sorted_reads) == 1 and f"LIMIT {most + 1})" in sorted_reads[0]
    assert not paginator.alone and paginator.walk_ms == catalog_module.WALK_MS_PER_MODEL
    expected = HubModel.objects.search("okapi").order_by("-downloads", "repo_id")
    assert [row.repo_id for row in page] == list(expected.values_list("repo_id", flat=True)[:10])

    def sorting_reads(query: CatalogQuery) -> int:
        with CaptureQueriesContext(connection) as queries:
            catalog_module.CappedPaginator(query, 10).page(1)
        return sum("MATERIALIZED" in q["sql"] for q in queries.captured_queries)

    assert sorting_reads(CatalogQuery(q="okapi", hybrid="no")) == 0
    assert sorting_reads(CatalogQuery(q="okapi", hybrid="no", sort="name")) == 0
    assert sorting_reads(CatalogQuery(q="okap", hybrid="no")) == 1  # another search, the same rows
    learned = catalog_module._more_than[CatalogQuery(q="okapi", hybrid="no", sort="", page="")]
    assert learned[1] == most
    catalog_module._more_than[CatalogQuery(q="okapi", hybrid="no", sort="", page="")] = (
        learned[0] - catalog_module.TABLE_SECONDS - 1,
        learned[1],
    )
    assert sorting_reads(CatalogQuery(q="okapi", hybrid="no")) == 1  # forgotten: tried again


def test_a_search_the_sample_holds_past_the_cap_is_not_counted(
    client: Client, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search with no filter that the catalog's sample surely holds more matches of than the
    cap reads no count: its page walks its order to the page's rows, a word's search through
    the table, and says "50+". One the sample holds fewer of is counted as before."""
    if connection.vendor != "postgresql":
        pytest.skip("the sample and the word index are PostgreSQL's")
    settings.DASHBOARD_PAGE_CACHE_SECONDS = 0
    monkeypatch.setattr(catalog_module, "COUNT_CAP", 50)
    monkeypatch.setattr(catalog_module, "_table", [])
    monkeypatch.setattr(catalog_module, "SAMPLE_BLOCKS", 10**6)  # every model: no chance
    monkeypatch.setattr(catalog_module, "_sample", [])
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE registry_hubmodel CASCADE")
    many_models(1200)  # "…-3b" in 172 models, "qwen" in 200, both in 28
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE registry_hubmodel")
    sample = catalog_module.search_sample()
    assert all(words.startswith(" ") for words in sample.words)  # each word after a space
    assert sum(" conversational" in words for words in sample.words) == 1200
    assert sample.matching([], ["3b"]) == 172 and sample.matches_floor(["qwen"], ["3b"]) == 28
    assert sample.matching([], ["b"]) == 0 < sample.matching(["b"])  # a word's start only

    def read(q: str) -> tuple[str, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            body = client.get("/", {"q": q}).content.decode()
        return body, [query["sql"] for query in queries.captured_queries]

    for q in ("3b", "3b chat"):
        paginator = catalog_module.CappedPaginator(CatalogQuery(q=q), 50)
        assert paginator.past_cap and paginator.capped, q
        body, sql = read(q)
        assert "50+ models" in body
        assert not any(s.endswith("LIMIT 51") for s in sql), sql  # no count
        (listing,) = [s for s in sql if "search_words" in s]
        assert "ORDER BY" in listing and listing.endswith("LIMIT 51 OFFSET 0")
        expected = HubModel.objects.search(q).order_by("-downloads", "repo_id")[:50]
        shown = [row.repo_id for row in paginator.page(1)]
        assert shown == list(expected.values_list("repo_id", flat=True))
    body, sql = read("3b qwen")  # 28 models: counted
    assert "28 models" in body and any(s.endswith("LIMIT 51") for s in sql)
    assert not catalog_module.CappedPaginator(CatalogQuery(q="3b qwen"), 50).past_cap
    # With a filter the sample says nothing: counted.
    assert not catalog_module.CappedPaginator(CatalogQuery(q="3b", hybrid="no"), 50).past_cap
