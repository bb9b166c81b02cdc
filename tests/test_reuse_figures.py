"""One definition of each reuse figure: the summary, the settings grid, the break list, the pair
pages and the catalog column say the same numbers for the same data (`checks.figures`)."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client

from checks.digest import variant_key
from checks.figures import broken_pairs, percent, setting_figure, share_figure
from checks.reports import RequestPair, TemplateReport, VariantResult
from checks.setups import THINKING_DEFAULT, variant_for
from dashboard.stored_reports import rebuild
from registry.models import HubModel
from registry.verdicts import latest_check
from tests.dashboard_data import Catalog, build_catalog
from tests.dashboard_data import healthy_service as healthy_service  # a fixture

pytestmark = pytest.mark.django_db


def latest_report(model: HubModel) -> TemplateReport | None:
    snapshot = model.current_snapshot
    assert snapshot is not None and snapshot.default_template is not None
    check = latest_check(snapshot.default_template)
    return rebuild(check.report) if check is not None else None


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def pair_page_share(
    client: Client, model: HubModel, variant: VariantResult, pair: RequestPair
) -> str:
    url = f"/m/{model.repo_id}/pair/{variant_key(variant)}/{pair.session}/{pair.index}/"
    page = client.get(url, follow=True)
    assert page.status_code == 200, url
    found = re.search(r"A prefix cache can reuse (\d+%) of request", text_of(page.content.decode()))
    assert found, url
    return found.group(1)


@pytest.mark.usefixtures("healthy_service")
def test_every_place_on_a_model_page_agrees_on_the_reuse_figures(client: Client) -> None:
    catalog: Catalog = build_catalog()
    checked = 0
    for model in (catalog.unsafe, catalog.changed):
        report = latest_report(model)
        assert report is not None
        page = client.get(f"/m/{model.repo_id}/").content.decode()
        text = text_of(page)
        unsafe = [v for v in report.variants if broken_pairs(v.sessions)]
        assert unsafe, f"{model.repo_id} should have a setting that breaks"
        for variant in report.variants:
            # The grid: each setting's mean over every request pair it rendered.
            figure = setting_figure(s for s in variant.sessions if s.rendered)
            assert figure is not None
            assert variant.mean_reusable_share == figure.mean  # stored at check time, same rule
            cell = re.search(
                rf'<td class="num" data-setting="{variant_key(variant)}" title="{figure.over}">'
                r"(\d+%)</td>",
                page,
            )
            assert cell and cell.group(1) == figure.text
        for variant in unsafe:
            broken = broken_pairs(variant.sessions)
            kept = share_figure(broken)
            assert kept is not None
            # The summary's "only about X%" for this setting is the mean over its broken pairs…
            assert f"only about {kept.text} of the next prompt can come from the cache" in text
            assert kept.over_breaks in text
            # …which is the mean of what the pair pages say, one pair at a time.
            shown = [pair_page_share(client, model, variant, p) for p in broken]
            assert shown == [percent(p.reusable_share) for p in broken]
            checked += len(shown)
        # The break list: each group's figure is over its pairs, whose pair pages give the range.
        groups = re.findall(r'<span class="break-share">(.*?)</span>', page)
        assert groups
        for words in map(text_of, groups):
            found = re.fullmatch(
                r"(\d+%) of the next prompt kept(?: on average \((\d+%)(?:–(\d+%))?\))?", words
            )
            assert found, words
        for variant in unsafe:
            kept = share_figure(broken_pairs(variant.sessions))
            assert kept is not None
            one_group = f"{kept.text} of the next prompt kept on average ({kept.span})"
            if kept.pairs == 1:
                one_group = f"{kept.text} of the next prompt kept"
            if len(unsafe) == 1 and only_fails(variant):  # the group is exactly these pairs
                assert one_group in [text_of(g) for g in groups]
            # The pair page of a broken pair repeats the setting's figure beside its own.
            if kept.pairs > 1:
                first = broken_pairs(variant.sessions)[0]
                url = (
                    f"/m/{model.repo_id}/pair/{variant_key(variant)}/{first.session}/{first.index}/"
                )
                pair_text = text_of(client.get(url, follow=True).content.decode())
                assert f"a prefix cache keeps {kept.text} on average" in pair_text
    assert checked >= 2

    # The catalog's column is the headline setting's grid figure.
    report = latest_report(catalog.unsafe)
    assert report is not None
    headline = variant_for(report, THINKING_DEFAULT)
    assert headline is not None
    listing = client.get("/", {"q": catalog.unsafe.repo_id}).content.decode()
    cells = re.findall(r'<td class="num">([^<]*)</td>', listing)
    assert percent(headline.mean_reusable_share) in cells, cells


def only_fails(variant: VariantResult) -> bool:
    """Every break of this setting has one cause and wording, so the break list has one group."""
    broken = broken_pairs(variant.sessions)
    return len({(p.cause, re.sub(r"\d+", "#", p.detail)) for p in broken}) == 1 and not any(
        p.status in ("reply", "warn") for s in variant.sessions for p in s.pairs
    )
