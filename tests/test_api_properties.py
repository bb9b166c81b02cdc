"""Every operation of the JSON API, driven from its generated OpenAPI schema with generated
hostile input (schemathesis, on Hypothesis): no answer is a 5xx, and every answer is what the
schema says it is (status, content type, headers, body).

Both generation modes run: positive (input the schema allows, so the API must take it) and
negative (input it forbids: wrong types, NUL bytes, over-long text, missing fields, which the API
must refuse with a documented 4xx); schemathesis also tries the methods a path does not take.
Bounded by MAX_EXAMPLES generated cases per operation. No operation is excluded, the schema
document included. The webhook is called with the configured secret, so that its body is
exercised rather than only its 403 (test_registry_api.py covers the secret itself).

Generated ids rarely name a tracked model or a stored template, so a second test sends the
catalog's own ids to each operation and checks those answers against the schema too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from cachesafe.wsgi import application
from registry import tracking
from registry.models import HubModel
from tests.dashboard_data import Catalog, build_catalog

MAX_EXAMPLES = 40
SECRET = "property-test-secret"


# Loaded when the module is collected, from the API itself (serving the schema needs no
# database). Not through `schemathesis.pytest.from_fixture`: its lazy loader does not run under
# pytest 9 (it renames test nodes through an attribute pytest 9 removed).
# schemathesis leaves out the path it loaded the schema from unless a filter names it: this
# filter names every path, so GET /api/openapi.json is tested like the rest.
schema = schemathesis.openapi.from_wsgi(
    "/api/openapi.json",
    application,
    config=schemathesis.Config.from_dict(
        {
            "generation": {
                "mode": "all",
                "max-examples": MAX_EXAMPLES,
                # Never write a .hypothesis/ folder into the work tree.
                "database": "none",
            },
            "checks": {
                # schemathesis's default list of rejections, plus 413: refusing a body over the
                # operation's size cap, as its schema documents, is a rejection too. Without it
                # a rare over-long generated body to POST /api/diagnose failed the run (one run
                # at 40 examples, one of two at 400).
                "negative_data_rejection": {
                    "expected-statuses": [
                        *("400", "401", "403", "404", "405", "406", "409", "413", "415"),
                        *("422", "428", "429", "5xx"),
                    ]
                },
            },
        }
    ),
).include(path_regex=r"^/(api|hooks)/")


@pytest.fixture
def catalog(db: None, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Catalog]:
    """A small catalog to look at and the webhook's secret; and the database connection kept
    open across requests, as Django's test client keeps it (the WSGI handler would close it
    after each, and with it the test's transaction)."""
    built = build_catalog()
    settings.HF_WEBHOOK_SECRET = SECRET
    # Room for every example: spent after 30, the allowance would answer all the rest with 429
    # before their bodies are read (that answer is tested in test_registry_api.py).
    monkeypatch.setattr(tracking, "TRACK_REQUESTS_PER_HOUR", 100 * MAX_EXAMPLES)
    tracking.forget_track_requests("127.0.0.1")
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield built
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
# One catalog for all of an operation's examples, on purpose: they only read it, or add to it.
# Not too_slow either: the machine is shared, and MAX_EXAMPLES bounds the run anyway.
@hypothesis_settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
def test_api_answers_every_input_within_its_schema(
    case: schemathesis.Case[Any], catalog: Catalog
) -> None:
    headers = {"X-Webhook-Secret": SECRET} if case.path == "/hooks/hub" else None
    case.call_and_validate(headers=headers)


def test_the_catalogs_own_ids_answer_within_the_schema(catalog: Catalog) -> None:
    tracked = [catalog.unsafe, catalog.changed, catalog.pending, catalog.hostile]
    shas = [sha for model in tracked if (sha := template_sha(model))]
    shas.append(catalog.old_version.sha256)
    cases = [
        *(
            schema["/api/models/{org}/{name}"]["GET"].Case(
                path_parameters=dict(zip(("org", "name"), m.repo_id.split("/"), strict=True))
            )
            for m in tracked
        ),
        *(
            schema["/api/templates/{sha256}"]["GET"].Case(path_parameters={"sha256": s})
            for s in shas
        ),
        *(schema["/api/checks/{sha256}"]["GET"].Case(path_parameters={"sha256": s}) for s in shas),
        schema["/api/models"]["GET"].Case(query={"q": "demo", "sort": "changed"}),
        schema["/api/models"]["POST"].Case(body={"repo_id": catalog.safe.repo_id}),
        schema["/hooks/hub"]["POST"].Case(
            body={"event": {"scope": "repo.content"}, "repo": {"name": catalog.safe.repo_id}},
            headers={"X-Webhook-Secret": SECRET},
        ),
    ]
    statuses = [case.call_and_validate().status_code for case in cases]
    assert set(statuses[: len(tracked)]) == {200}
    assert 200 in statuses[len(tracked) : len(tracked) + len(shas)]


def template_sha(model: HubModel) -> str | None:
    snapshot = model.current_snapshot
    return snapshot.default_template.sha256 if snapshot else None
