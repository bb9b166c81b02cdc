"""The pages' query parameters, driven with generated hostile values: never a 5xx.

Every state of a page lives in its URL, so anything a stranger can put in a link reaches the
catalog query, the feeds and the pair page. On PostgreSQL (CI) this covers NUL bytes, which it
refuses in text.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.dashboard_data import Catalog, build_catalog, healthy_service  # noqa: F401

pytestmark = pytest.mark.django_db

#: Text as strangers write it: anything Unicode, NUL and control characters included.
HOSTILE = st.one_of(
    st.text(max_size=300),
    st.sampled_from(["\x00", "%00", "' OR 1=1 --", "<script>", "../" * 20, "9" * 400, "-1"]),
)
PARAMS = ["q", "verdict", "thinking", "hybrid", "tools", "probe", "author", "sort", "page"]
EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


@EXAMPLES
@given(query=st.dictionaries(st.sampled_from(PARAMS), HOSTILE, max_size=4), htmx=st.booleans())
def test_catalog_and_feed_parameters(
    client: Client, catalog: Catalog, query: dict[str, str], htmx: bool
) -> None:
    headers: dict[str, Any] = {"HX-Request": "true"} if htmx else {}
    for path in ("/", "/feeds/changes.atom"):
        response = client.get(path, query, headers=headers)
        assert response.status_code < 500, (path, query)


@EXAMPLES
@given(model=HOSTILE, sync=HOSTILE)
def test_model_and_pair_page_parameters(
    client: Client, catalog: Catalog, model: str, sync: str
) -> None:
    assert catalog.unsafe.current_snapshot is not None
    sha = catalog.unsafe.current_snapshot.default_template.sha256
    pages = [
        f"/m/{catalog.unsafe.repo_id}/",
        f"/t/{sha}/",
        f"/t/{sha}/pair/default/chat/1/",
        f"/badge/{catalog.unsafe.repo_id}.svg",
    ]
    for path in pages:
        response = client.get(path, {"model": model, "sync": sync})
        assert response.status_code < 500, (path, model, sync)
