"""Diagnosis on the site: the API and the page, each cause from requests written for it."""

from __future__ import annotations

import html
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from pytest_django import DjangoAssertNumQueries

from checks import cli_diagnose
from dashboard import diagnosis
from registry.local_import import import_local
from registry.models import HubModel
from tests.dashboard_data import Catalog, add_model, build_catalog
from tests.diagnose_cases import CASES, MARKER, PLAIN, conversation

pytestmark = pytest.mark.django_db
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture
def catalog() -> Catalog:
    return build_catalog()


def post(client: Client, body: dict[str, Any]) -> Any:
    return client.post("/api/diagnose", json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(
    ("name", "template", "bodies", "pair", "cause"), CASES, ids=[c[0] for c in CASES]
)
def test_each_cause_from_the_api(
    client: Client, name: str, template: str, bodies: list[dict[str, Any]], pair: int, cause: str
) -> None:
    answer = post(client, {"requests": bodies, "template": template})
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert data["template"] == "pasted template" and data["requests"] == len(bodies)
    found = data["pairs"][pair - 1]
    assert (found["from"], found["to"], found["cause"]) == (pair, pair + 1, cause)


def test_a_tracked_models_template(client: Client, catalog: Catalog) -> None:
    add_model("org/plain", PLAIN, commit="c" * 40)
    answer = post(client, {"requests": conversation(), "repo_id": "org/plain"})
    assert answer.status_code == 200, answer.content
    assert answer.json()["template"] == "org/plain"
    assert [p["cause"] for p in answer.json()["pairs"]] == ["none", "none"]
    missing = post(client, {"requests": conversation(), "repo_id": "nobody/none"})
    assert missing.status_code == 404 and "not tracked" in missing.json()["error"]["message"]
    # The track form's rules: a pasted Hub address is the model; a path is not an id, and why.
    pasted = post(
        client, {"requests": conversation(), "repo_id": "https://huggingface.co/org/plain"}
    )
    assert pasted.status_code == 200 and pasted.json()["template"] == "org/plain"
    refused = "'../../etc/passwd' is not a Hub model id (expected owner/name)"
    path = post(client, {"requests": conversation(), "repo_id": "../../etc/passwd"})
    assert path.status_code == 400
    assert path.json()["error"]["message"] == f"body.payload.repo_id: Value error, {refused}"
    blank = post(client, {"requests": conversation(), "repo_id": " ", "template": PLAIN})
    assert blank.status_code == 200 and blank.json()["template"] == "pasted template"
    page = client.post(
        "/diagnose/", {"requests": json.dumps(conversation()), "repo_id": "../../etc/passwd"}
    )
    assert page.status_code == 400 and html.escape(refused) in page.content.decode()


def test_a_tracked_models_named_templates_render_as_the_cli_renders_its_folder(
    client: Client,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    """A repo with `default` and `tool_use`, and one with `rag` and `tool_use` (no default),
    tracked from their folders: the page renders each request with the template transformers
    picks, so its diagnosis is `python -m checks diagnose`'s on the same folder, not the
    default's (or a stand-in's)."""
    # The CLI takes a folder for a repo by its chat_template.jinja or tokenizer_config.json.
    config = json.dumps({"eos_token": "</s>"})
    layouts = {
        "org/tools": {"chat_template.jinja": PLAIN, "tool_use.jinja": MARKER},
        "org/no-default": {"rag.jinja": PLAIN, "tool_use.jinja": MARKER},
    }
    for repo_id, files in layouts.items():
        for name, text in {**files, "tokenizer_config.json": config}.items():
            folder = "additional_chat_templates" if name in ("rag.jinja", "tool_use.jinja") else ""
            path = tmp_path / "repos" / repo_id / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    import_local(tmp_path / "repos")
    with_tools = conversation()
    without_tools = [{k: v for k, v in body.items() if k != "tools"} for body in with_tools]
    log = tmp_path / "requests.jsonl"
    seen = {}
    for repo_id in layouts:
        for bodies in (with_tools, without_tools):
            log.write_text("".join(json.dumps(body) + "\n" for body in bodies))
            out = io.StringIO()
            folder = str(tmp_path / "repos" / repo_id)
            failed = cli_diagnose.main([str(log), "--template", folder, "--json"], out)
            answer = post(client, {"requests": bodies, "repo_id": repo_id}).json()
            if failed:
                said = capsys.readouterr().err
                cli = said.removeprefix("python -m checks diagnose: the template failed: ")
                assert answer["pairs"] == [], answer
                assert answer["error"] == f"the template failed on these requests: {cli.strip()}"
                seen[repo_id, bodies is with_tools] = "error"
            else:
                assert answer["pairs"] == json.loads(out.getvalue())["pairs"]
                seen[repo_id, bodies is with_tools] = answer["pairs"][0]["cause"]
    # `tool_use` (its marker moves) renders the requests with tools; without, `default`, or
    # transformers' ValueError where there is none.
    assert seen == {
        ("org/tools", True): "template",
        ("org/tools", False): "none",
        ("org/no-default", True): "template",
        ("org/no-default", False): "error",
    }
    page = client.post(
        "/diagnose/",
        {"requests": "\n".join(map(json.dumps, without_tools)), "repo_id": "org/no-default"},
    )
    assert "This model has multiple chat templates with no default specified!" in html.unescape(
        page.content.decode()
    )
    # The model, its snapshot and default template in one query, its named templates in one.
    with django_assert_num_queries(2):
        source, _ = diagnosis.template_source("org/tools", "")
    assert source.names == ("default", "tool_use")


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"requests": [{"messages": []}, {"messages": []}], "template": PLAIN}, 400, ""),
        ({"requests": conversation()}, 404, "give a tracked model or paste one"),
        ({"requests": conversation()[:1], "template": PLAIN}, 400, ""),
        ({"requests": [{"messages": [{"content": "no role"}]}] * 2, "template": PLAIN}, 400, ""),
    ],
    ids=["empty-messages", "no-template", "one-request", "no-role"],
)
def test_bad_input_is_a_clear_error(
    client: Client, body: dict[str, Any], status: int, message: str
) -> None:
    answer = post(client, body)
    assert answer.status_code == status, answer.content
    assert message in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (LOOP, "CPU budget"),
        ("{% for %}", "TemplateSyntaxError"),
        ("{{ raise_exception('no') }}", "no"),
    ],
    ids=["loops", "syntax-error", "raises"],
)
def test_a_template_that_fails_is_the_answer_not_a_crash(
    client: Client, template: str, message: str
) -> None:
    answer = post(client, {"requests": conversation(), "template": template})
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert data["pairs"] == [] and message in data["error"]
    # The sandbox goes on: the next diagnosis works.
    assert post(client, {"requests": conversation(), "template": PLAIN}).json()["pairs"]


def test_the_page_diagnoses_pasted_requests_and_stores_nothing(client: Client) -> None:
    (_, template, bodies, _, _) = next(c for c in CASES if c[0] == "reasoning_dropped")
    pasted = "\n".join(json.dumps(b) for b in bodies)
    before = HubModel.objects.count()
    page = client.post("/diagnose/", {"requests": pasted, "template": template})
    body = page.content.decode()
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    assert 'data-cause="reasoning_dropped"' in body and "send it back" in body
    assert "Request 2 → 3" in body
    assert HubModel.objects.count() == before  # nothing tracked, nothing kept


def test_the_page_says_when_nothing_missed(client: Client) -> None:
    """A pair whose next request begins with the whole of the previous one is no miss, and
    the page says so rather than leaving a reader to make sense of "none" and a share."""
    pasted = "\n".join(json.dumps(body) for body in conversation())
    page = client.post("/diagnose/", {"requests": pasted, "template": PLAIN})
    body = page.content.decode()
    assert body.count('data-cause="none"') == 2
    assert "No miss: request 2 begins with all of request 1, so a prefix cache reuses it" in body
    assert "the rest of request 2 is what the client added" in body


def test_the_page_counts_characters_from_one_as_it_counts_messages(
    client: Client, catalog: Catalog
) -> None:
    """The changed character of a system prompt, and an untracked model named as typed."""
    (_, template, bodies, _, _) = next(c for c in CASES if c[0] == "system_changed")
    pasted = "\n".join(json.dumps(b) for b in bodies)
    body = client.post("/diagnose/", {"requests": pasted, "template": template}).content.decode()
    prefix = "You are a coding agent. x-billing-header: cc_version=2.1; cch="
    assert f"message 1, content, character {len(prefix) + 1}." in body
    untracked = client.post("/diagnose/", {"requests": pasted, "repo_id": "nobody/nothing"})
    assert "The model nobody/nothing is not tracked" in untracked.content.decode()


def test_the_page_escapes_what_it_echoes(client: Client) -> None:
    hostile = '{"messages": [{"role": "user", "content": "<script>alert(1)</script>"}]}\n' * 2
    page = client.post("/diagnose/", {"requests": hostile, "template": "<b>{{ messages }}</b>"})
    body = page.content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;" in body


def test_the_page_says_what_is_wrong(client: Client) -> None:
    page = client.post("/diagnose/", {"requests": "{oops", "template": PLAIN})
    assert page.status_code == 400
    assert "Requests line 1: not valid JSON" in page.content.decode()
    # json raises RecursionError, not a decoding error, for nesting deeper than it recurses.
    deep = client.post("/diagnose/", {"requests": "[" * 5000, "template": PLAIN})
    assert deep.status_code == 400
    assert "Requests line 1: not valid JSON (nested too deeply)" in deep.content.decode()
    # And a plain ValueError for an integer of more than 4,300 digits.
    huge = '{"messages": [{"role": "user", "content": "x"}], "n": ' + "1" * 4400 + "}"
    long_number = client.post("/diagnose/", {"requests": huge, "template": PLAIN})
    assert long_number.status_code == 400
    assert "not valid JSON (Exceeds the limit (4300 digits)" in long_number.content.decode()
    too_big = client.post(
        "/diagnose/", {"requests": "x" * (2 * 1024 * 1024 + 1), "template": PLAIN}
    )
    assert too_big.status_code == 413 and "over 2,097,152 characters" in too_big.content.decode()
