"""`python -m checks` as a user runs it: files, configs, directories, JSON, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checks import cli
from checks.conversations import SYSTEM_PROMPT
from tests.checks.conftest import CHATML, REASONING_ON_LAST

REPO = Path(__file__).resolve().parents[2]
# Line 2 writes a marker on the last message: it moves on every turn.
MARKER = """{% for m in messages %}
{% if loop.last %}[LAST]{% endif %}{{ m.role }}: {{ m.content }}
{% endfor %}
{% if add_generation_prompt %}assistant:{% endif %}"""


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "checks", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def started(*args: str, **options: Any) -> subprocess.Popen[bytes]:
    """`python -m checks` started, its output piped, for a test that acts while it runs."""
    return subprocess.Popen(
        [sys.executable, "-m", "checks", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        **options,
    )


def results(process: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert process.returncode == 0, process.stderr
    payload = json.loads(process.stdout)
    return list(payload["results"])


def test_table_for_a_jinja_file(tmp_path: Path) -> None:
    path = tmp_path / "marker.jinja"
    path.write_text(MARKER)
    process = run(str(path))
    assert process.returncode == 0
    assert "marker.jinja" in process.stdout
    assert "Breaks the cache" in process.stdout  # the site's words, not `unsafe`
    assert "history at byte 0 (user 1, template line 2" in process.stdout


def test_fail_on_gates_a_ci_job_with_a_hint_per_failing_template(tmp_path: Path) -> None:
    (tmp_path / "marker.jinja").write_text(MARKER)
    (tmp_path / "chatml.jinja").write_text(CHATML)
    (tmp_path / "loop.jinja").write_text(
        "{% for m in messages %}{{ m.content | nope }}{% endfor %}"
    )
    gate = run(str(tmp_path), "--fail-on", "unsafe")
    assert gate.returncode == 1
    [hint] = gate.stderr.strip().splitlines()
    assert hint.startswith(f"{tmp_path / 'marker.jinja'}: Breaks the cache: ")
    assert "template line 2" in hint and "render history the same way every turn" in hint
    both = run(str(tmp_path), "--fail-on", "unsafe", "--fail-on", "error")
    assert both.returncode == 1
    [refused] = [line for line in both.stderr.splitlines() if "loop.jinja" in line]
    assert refused.startswith(f"{tmp_path / 'loop.jinja'}: Does not render: ")
    assert "does not render" not in refused.lower().split("does not render", 1)[1]
    assert run(str(tmp_path / "chatml.jinja"), "--fail-on", "unsafe").returncode == 0


def test_json_schema_for_a_tokenizer_config_with_named_templates(tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<s>", "special": True},
        "eos_token": "</s>",
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}" + CHATML},
            {"name": "tool_use", "template": MARKER},
            {"name": "rag", "template": CHATML},
        ],
    }
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config))
    (report,) = results(run(str(path), "--json"))
    assert report["file"] == str(path)
    assert len(report["sha256"]) == 64
    assert report["origin"] == "tokenizer_config.json"
    assert report["template_names"] == ["default", "tool_use", "rag"]
    # As in transformers, `default` renders requests without tools and `tool_use` those with
    # tools; any other name is checked on its own.
    assert {(v["template_name"], v["verdict"]) for v in report["variants"]} == {
        ("default", "unsafe"),
        ("rag", "safe"),
    }
    assert all(isinstance(v["kwargs"], dict) for v in report["variants"])
    assert report["verdict"] == "unsafe"
    failing_sessions = {f["session"] for f in report["failures"]}
    assert "chat_with_tools" in failing_sessions
    assert not failing_sessions & {"chat", "chat_no_system", "reasoning_history"}
    failure = report["failures"][0]
    assert {
        "session",
        "request_index",
        "cause",
        "byte_offset",
        "token_index",
        "segment",
        "template_lines",
    } <= set(failure)
    # The marker first moves right after the system prompt's line.
    system_line = f"system: {SYSTEM_PROMPT}\n"
    assert (failure["session"], failure["cause"], failure["segment"]) == (
        "chat_with_tools",
        "history",
        "user 1",
    )
    assert (failure["byte_offset"], failure["template_lines"][0]) == (len(system_line), 2)


def test_named_templates_without_a_default_need_a_name(tmp_path: Path) -> None:
    """No `default` among the named templates: transformers raises for a request without tools
    unless the caller names a template, and renders one with tools with `tool_use`. The config
    and its folder say so alike, and the gate takes what the names render."""
    tool_use = "{% if tools %}tools: {{ tools | length }}\n{% endif %}" + CHATML
    config = {
        "eos_token": "<|im_end|>",
        "chat_template": [
            {"name": "tool_use", "template": tool_use},
            {"name": "rag", "template": CHATML},
        ],
    }
    path = tmp_path / "model" / "tokenizer_config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    for target in (path, path.parent):
        table = run(str(target))
        assert table.returncode == 0, table.stderr
        row = table.stdout.splitlines()[1]
        assert "  Safe where it renders  No default template: transformers renders a" in row
        (report,) = results(run(str(target), "--json"))
        assert report["template_names"] == ["tool_use", "rag"]
        assert report["verdict"] == "safe_where_renderable"
        assert report["summary"].startswith(
            "No default template: transformers renders a request without tools only when the "
            'caller names a template (chat_template="rag" or "tool_use"); with tools it uses '
            '"tool_use". '
        )
        unnamed = report["variants"][0]
        assert (unnamed["template_name"], unnamed["label"]) == ("default", "no kwargs")
        sessions = {s["session"]: s for s in unnamed["sessions"]}
        assert sessions["chat_with_tools"]["rendered"]
        assert not sessions["chat"]["rendered"]
        assert sessions["chat"]["error"] == (
            "ValueError: This model has multiple chat templates with no default specified! "
            "Please either pass a chat template or the name of the template you wish to use to "
            "the `chat_template` argument. Available template names are ['rag', 'tool_use']."
        )
        assert [(v["template_name"], v["verdict"]) for v in report["variants"][1:]] == [
            ("tool_use", "safe"),
            ("rag", "safe"),
        ]
    # Every name renders every conversation and keeps the cache: no gate fails.
    assert run(str(path), "--fail-on", "unsafe", "--fail-on", "error").returncode == 0
    config["chat_template"][1]["template"] = MARKER  # type: ignore[index]
    path.write_text(json.dumps(config))
    gate = run(str(path.parent), "--fail-on", "unsafe")
    assert gate.returncode == 1
    assert f"{path.parent}: Breaks the cache: rag: no kwargs, chat: earlier messages" in gate.stderr


def test_directory_of_files_and_a_hostile_one(tmp_path: Path) -> None:
    (tmp_path / "a.jinja").write_text(CHATML)
    (tmp_path / "b.jinja").write_text(MARKER)
    (tmp_path / "loop.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "broken_tokenizer_config.json").write_text('{"chat_template": 42}')
    (tmp_path / "index.json").write_text("[]")  # not a template: ignored
    (tmp_path / "notes.txt").write_text("ignored")
    printed = run(str(tmp_path), "--json", "--timeout", "2")
    assert printed.stdout.count("\n") == 1  # one line into a pipe (indented on a terminal)
    # Assembled report by report, it is exactly what json.dumps writes for the whole.
    assert printed.stdout == json.dumps(json.loads(printed.stdout), ensure_ascii=False) + "\n"
    # In path order, although the workers take the longest template first.
    names = [Path(r["file"]).name for r in results(printed)]
    assert names == ["a.jinja", "b.jinja", "loop.jinja", "broken_tokenizer_config.json"]
    reports = {Path(r["file"]).name: r for r in results(printed)}
    assert reports["a.jinja"]["verdict"] == "safe"
    assert reports["b.jinja"]["verdict"] == "unsafe"
    assert reports["loop.jinja"]["verdict"] == "error"
    assert (
        reports["loop.jinja"]["summary"]
        == "Could not check this template: render exceeded its CPU budget of 2 s"
        " (at template line 1)."
    )
    assert reports["broken_tokenizer_config.json"]["verdict"] == "error"
    assert "got int" in reports["broken_tokenizer_config.json"]["summary"]


def test_a_syntax_error_reads_as_one_sentence(tmp_path: Path) -> None:
    """Jinja's message ends with a period of its own; the summary adds none after it."""
    (tmp_path / "bad.jinja").write_text("{{ messages | from_json }}")
    (report,) = results(run(str(tmp_path / "bad.jinja"), "--json"))
    assert report["verdict"] == "error"
    assert report["summary"] == (
        "Could not check this template: template syntax error at line 1: "
        "No filter named 'from_json'."
    )


def test_repository_directory_uses_transformers_precedence(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}" + CHATML)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "chat_template": MARKER})
    )
    (report,) = results(run(str(tmp_path), "--json"))
    assert report["origin"] == "chat_template.jinja"
    assert report["verdict"] == "safe"  # the .jinja file won over the config's template


def test_tokenizer_gives_token_indexes(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    words = "[LAST] user system assistant : What's the weather in Paris today ?"
    tokenizer.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok_path = tmp_path / "tokenizer.json"
    tok_path.write_text(tokenizer.to_str())
    path = tmp_path / "marker.jinja"
    path.write_text(MARKER)
    (report,) = results(run(str(path), "--json", "--tokenizer", str(tok_path)))
    assert report["tokenizer_sha256"]
    # chat_no_system's first pair: "[LAST]user: …" against "user: …" differ at token 0.
    (failure,) = [
        f for f in report["failures"] if (f["session"], f["request_index"]) == ("chat_no_system", 1)
    ]
    assert (failure["byte_offset"], failure["token_index"]) == (0, 0)
    chat = next(f for f in report["failures"] if f["session"] == "chat")
    assert chat["token_index"] > 0


@pytest.mark.parametrize(
    "args",
    [[], ["/definitely/not/here.jinja"], ["--tokenizer", "/missing.json", "x.jinja"], ["--bogus"]],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    process = run(*args)
    assert process.returncode == 2
    assert "usage:" in process.stderr


BOS_CONCAT = (
    "{{ bos_token + '' }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_a_lone_jinja_renders_with_marked_placeholder_tokens(tmp_path: Path) -> None:
    """Undefined bos_token + '' is an error in Jinja: a .jinja file alone must still check."""
    (tmp_path / "t.jinja").write_text(BOS_CONCAT)
    [report] = results(run(str(tmp_path / "t.jinja"), "--json"))
    assert report["verdict"] == "safe", report["reason"]
    assert "placeholder bos_token and eos_token" in report["summary"]


def test_a_lone_jinja_takes_the_tokens_of_the_config_beside_it(tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text(BOS_CONCAT)
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    [report] = results(run(str(tmp_path / "t.jinja"), "--json"))
    assert report["verdict"] == "safe"
    assert "placeholder" not in report["summary"]


def test_the_table_and_the_json_show_each_client_and_engine(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(
        ["<assistant> <user> <system> </s> <think> </think> weather Paris sunny walk"] * 5,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"]),
    )
    tok_path = tmp_path / "tokenizer.json"
    tok_path.write_text(tokenizer.to_str())
    path = tmp_path / "last.jinja"
    path.write_text(REASONING_ON_LAST)
    table = run(str(path), "--tokenizer", str(tok_path))
    assert table.returncode == 0, table.stderr
    assert "client (no kwargs)" in table.stdout
    assert "trimmable    block        hybrid       hybrid+ckpt  reply" in table.stdout
    typical = next(
        line for line in table.stdout.splitlines() if line.strip().startswith("typical   ")
    )
    assert typical.split()[1:5] == ["safe", "safe", "breaks", "safe"]
    assert "re-read, about " in typical and typical.endswith("tokens")

    (report,) = results(run(str(path), "--json", "--tokenizer", str(tok_path)))
    (variant,) = report["variants"]
    profiles = {c["profile"]: c for c in variant["clients"]}
    assert list(profiles) == [
        "typical",
        "reasoning_content",
        "thinking_chunks",
        "arguments_objects",
        "arguments_strings",
    ]
    assert profiles["typical"]["verdict"] == "safe"
    assert profiles["typical"]["engines"]["hybrid"] == "unsafe"
    assert profiles["thinking_chunks"]["verdict"] is None  # the template reads no chunks
    lost = [
        p for s in variant["sessions"] for p in s["pairs"] if s["session"] == "reasoning_history"
    ]
    assert {(p["status"], p["prompt_reuse"], p["reply_reuse"], p["unit"]) for p in lost} == {
        ("reply", True, False, "tokens")
    }
    for p in lost:
        # Whole 16-token blocks, up to where request k ends.
        assert p["reuse"]["block"] % 16 == 0 and p["reuse"]["block"] <= p["prompt_units"]
        assert p["reuse"]["trimmable"] >= p["prompt_units"] - 1


def test_fail_on_gates_the_readers_own_setup(tmp_path: Path) -> None:
    path = tmp_path / "last.jinja"
    path.write_text(REASONING_ON_LAST)
    # Safe for the typical setup: the prompt carries over, only the reply is re-read.
    assert run(str(path), "--fail-on", "unsafe").returncode == 0
    # On a hybrid model without checkpoints the same template loses every turn.
    hybrid = run(str(path), "--fail-on", "unsafe", "--engine", "hybrid")
    assert hybrid.returncode == 1
    # The sentence names the verdict itself: not said twice.
    assert f"{path}: Breaks the cache for a client that drops reasoning" in hybrid.stderr
    assert "Breaks the cache: Breaks the cache" not in hybrid.stderr
    assert "serve it with cache checkpoints" in hybrid.stderr
    checked = run(str(path), "--fail-on", "unsafe", "--engine", "hybrid_checkpoints")
    assert checked.returncode == 0 and "for your setup: Cache-safe" in checked.stdout
    assert run(str(path), "--engine", "quantum").returncode == 2


@pytest.mark.parametrize("given", ["inf", "1e9", "-1", "nan", "0", "ten"])
def test_a_cpu_budget_that_is_not_one_is_a_usage_error(tmp_path: Path, given: str) -> None:
    """`inf` overflowed the clock, `nan` and negatives hung until the wall guard: argparse
    says so at once, with exit 2, for the check and the diagnosis alike."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    for args in (
        (str(template),),
        ("diagnose", str(template), "--template", str(template)),
    ):
        process = run(*args, f"--cpu-seconds={given}", timeout=20)
        assert process.returncode == 2, process.stderr
        assert "--cpu-seconds" in process.stderr and "Traceback" not in process.stderr


def test_a_reader_who_stops_reading_ends_it_quietly(tmp_path: Path) -> None:
    """`python -m checks templates/ | head -3`: no BrokenPipeError traceback. The table is
    longer than a pipe holds, so the writer is still writing when the reader goes."""
    for n in range(300):
        (tmp_path / f"t{n:03d}.jinja").write_text(REASONING_ON_LAST)
    process = started(str(tmp_path))
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()  # as `head` does once it has its lines
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) in (0, 141), stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


def test_nothing_to_check_is_an_error_not_a_pass(tmp_path: Path) -> None:
    """A CI gate over a folder with no template, or over an empty file, must not pass."""
    empty_folder = tmp_path / "nothing"
    empty_folder.mkdir()
    (empty_folder / "README.md").write_text("no template here")
    gate = run(str(empty_folder), "--fail-on", "unsafe", "--fail-on", "error")
    assert gate.returncode == 2 and "no chat template found in" in gate.stderr
    blank = tmp_path / "blank.jinja"
    blank.write_text("  \n")
    refused = run(str(blank), "--fail-on", "error")
    assert refused.returncode == 1
    assert "Does not render: the template is empty: it renders nothing" in refused.stderr


def test_repositories_in_one_folder_are_told_apart_in_the_table(tmp_path: Path) -> None:
    for name, template in (("first", CHATML), ("second", REASONING_ON_LAST)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "chat_template.jinja").write_text(template)
    table = run(str(tmp_path)).stdout
    assert "\nfirst/chat_template.jinja " in table and "\nsecond/chat_template.jinja " in table


def test_json_carries_the_verdict_for_the_readers_setup(tmp_path: Path) -> None:
    """With --engine (or --client, --thinking) each result has the API's `setup`; without,
    the report alone."""
    path = tmp_path / "last.jinja"
    path.write_text(REASONING_ON_LAST)
    plain = json.loads(run(str(path), "--json").stdout)["results"][0]
    assert "setup" not in plain
    hybrid = json.loads(run(str(path), "--json", "--engine", "hybrid").stdout)["results"][0]
    assert hybrid["setup"]["engine"] == "hybrid" and hybrid["setup"]["verdict"] == "unsafe"
    assert hybrid["setup"]["sentence"].startswith("Breaks the cache for a client that")


def test_a_setup_option_is_read_without_the_spaces_around_it(tmp_path: Path) -> None:
    """`--engine " hybrid"` (a value pasted from a link) was refused as an invalid choice; the
    site reads the same value stripped, so the CLI does too. One still unknown is refused."""
    path = tmp_path / "last.jinja"
    path.write_text(REASONING_ON_LAST)
    found = run(str(path), "--json", "--engine", " hybrid", "--thinking", "default ")
    [result] = results(found)
    assert (result["setup"]["engine"], result["setup"]["thinking"]) == ("hybrid", "default")
    assert result["setup"]["verdict"] == "unsafe"
    unknown = run(str(path), "--engine", " quantum ")
    assert unknown.returncode == 2 and "invalid choice: 'quantum'" in unknown.stderr


def test_the_venv_runs_the_cli_from_any_folder(tmp_path: Path) -> None:
    """A CI job runs the gate from its own checkout: the venv `make install` built finds the
    project from there, with no PYTHONPATH (README, "As a gate in CI")."""
    (tmp_path / "models" / "mine").mkdir(parents=True)
    (tmp_path / "models" / "mine" / "chat_template.jinja").write_text(MARKER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    gate = subprocess.run(
        [sys.executable, "-m", "checks", "models/mine/", "--fail-on", "unsafe"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert gate.returncode == 1, gate.stderr
    assert gate.stderr.startswith("models/mine: Breaks the cache"), gate.stderr


def test_a_lone_surrogate_a_template_writes_is_printed_escaped(tmp_path: Path) -> None:
    """Jinja writes "\\ud800" as a lone surrogate, which strict UTF-8 output refuses: the table
    and the JSON print it escaped (in JSON, an escape JSON reads), exit 0, no traceback."""
    path = tmp_path / "surrogate.jinja"
    path.write_text('{{ raise_exception("bad \\ud800 token") }}')
    table = run(str(path))
    assert table.returncode == 0, table.stderr
    assert "bad \\ud800 token" in table.stdout and "Traceback" not in table.stderr
    [report] = results(run(str(path), "--json"))
    assert "bad \ud800 token" in report["summary"]


def test_paths_odd_for_the_table_are_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two configs of one name, one given relative and one absolute (no folder is common to
    both): a table, not a traceback. And a folder nested deeper than pathlib's recursion can
    walk (about a thousand levels, which a test cannot make and clean up portably: the walk is
    made to raise as it does there) is a usage error."""
    for name in ("r1", "r2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": CHATML})
        )
    relative = os.path.relpath(tmp_path / "r1" / "tokenizer_config.json", REPO)
    mixed = run(relative, str(tmp_path / "r2" / "tokenizer_config.json"))
    assert mixed.returncode == 0, mixed.stderr
    assert mixed.stdout.count("tokenizer_config.json") == 2

    def too_deep(self: Path, pattern: str) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(Path, "rglob", too_deep)
    assert cli.main([str(tmp_path)]) == 2
    assert "folders nested too deeply to walk" in capsys.readouterr().err


def test_a_cache_dir_that_cannot_serve_is_a_usage_error_or_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    (tmp_path / "afile").write_text("")
    refused = run(str(path), "--cache-dir", str(tmp_path / "afile"))
    assert refused.returncode == 2 and "not a directory" in refused.stderr
    cache = tmp_path / "cache"
    assert run(str(path), "--cache-dir", str(cache)).returncode == 0
    [entry] = cache.glob("*.json")
    entry.write_text("{}")  # valid JSON, not a report: checked again
    again = run(str(path), "--cache-dir", str(cache))
    assert again.returncode == 0, again.stderr
    assert "Cache-safe" in again.stdout


def test_thinking_given_with_the_default_value_gates_on_that_setting(tmp_path: Path) -> None:
    """`--thinking default` asks for the template's defaults alone, as `?thinking=default` does
    on the site; the CLI could not tell it from the option left out, and gated on every
    setting (here enable_thinking=false, which breaks)."""
    template = tmp_path / "chat_template.jinja"
    template.write_text(
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}\n"
        "{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and "
        "enable_thinking is false %}<think></think>{% endif %}{% endif %}\n"
    )
    assert run(str(template), "--fail-on", "unsafe").returncode == 1  # the headline
    chosen = run(str(template), "--thinking", "default", "--fail-on", "unsafe")
    assert chosen.returncode == 0, chosen.stderr
    assert run(str(template), "--thinking", "off", "--fail-on", "unsafe").returncode == 1


def test_a_folder_of_repositories_checks_each_as_its_repository(tmp_path: Path) -> None:
    """`models/` holding model folders in the layout transformers 5 saves (chat_template.jinja
    beside a tokenizer_config.json that has no chat_template): the folder passes the gate
    exactly when each repository does. And precedence holds inside it: a stale template left in
    tokenizer_config.json is not the one transformers uses, so it must not fail the gate."""
    for name in ("a", "b"):
        repo = tmp_path / "models" / name
        repo.mkdir(parents=True)
        (repo / "chat_template.jinja").write_text(CHATML)
        (repo / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": "<s>", "eos_token": "</s>"})
        )
    stale = tmp_path / "models" / "c"
    stale.mkdir()
    (stale / "chat_template.jinja").write_text(CHATML)
    (stale / "tokenizer_config.json").write_text(json.dumps({"chat_template": MARKER}))
    for folder in ("a", "b", "c"):
        alone = run(str(tmp_path / "models" / folder), "--fail-on", "error", "--fail-on", "unsafe")
        assert alone.returncode == 0, alone.stderr
    gate = run(str(tmp_path / "models"), "--fail-on", "error", "--fail-on", "unsafe")
    assert gate.returncode == 0, gate.stderr


def test_a_repositorys_tokenizer_cut_mid_character_costs_only_the_token_checks(
    tmp_path: Path,
) -> None:
    """A repository's own tokenizer.json that tokenizers cannot read costs the token-level
    checks, not the verdict (sandbox_worker.job_encoder): so when it is cut short in the middle
    of a UTF-8 character too, not a usage error that stops every other check of the run."""
    good, cut = tmp_path / "good", tmp_path / "cut"
    for repo in (good, cut):
        repo.mkdir()
        (repo / "chat_template.jinja").write_text(CHATML)
    (cut / "tokenizer.json").write_bytes('{"version": "1.0", "model": {"vocab": {"Ġ'.encode()[:-1])
    process = run(str(good), str(cut), "--json")
    assert process.returncode == 0, process.stderr
    reports = json.loads(process.stdout)["results"]
    assert [r["verdict"] for r in reports] == ["safe", "safe"]
    assert "Checked on bytes only" in reports[1]["summary"]


def test_a_linked_repository_folder_is_checked_not_skipped(tmp_path: Path) -> None:
    """`models/llama -> /data/llama`: the linked model is checked (a link loop still ends);
    it was silently left out, and a gate over the folder passed without checking it."""
    target = tmp_path / "data" / "llama"
    target.mkdir(parents=True)
    (target / "chat_template.jinja").write_text(MARKER)
    models = tmp_path / "models"
    models.mkdir()
    (models / "local.jinja").write_text(CHATML)
    (models / "llama").symlink_to(target, target_is_directory=True)
    (models / "loop").symlink_to(models, target_is_directory=True)
    gate = run(str(models), "--fail-on", "unsafe", timeout=120)
    assert gate.returncode == 1, gate.stdout
    assert "Breaks the cache" in gate.stderr


def test_ctrl_c_ends_the_run_with_one_line(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) printed a KeyboardInterrupt traceback
    and exited -2, after the renders under way had finished; a shell expects 130, and a reader
    one line, now."""
    slow = "{% for i in range(100000) %}{% for j in range(10) %}{% endfor %}{% endfor %}"
    for n in range(4):  # about 20 s of renders on two cores: interrupted long before the end
        (tmp_path / f"t{n}.jinja").write_text(f"{slow}{{# {n} #}}{CHATML}")
    # A process group of its own, as a terminal's job is.
    process = started(str(tmp_path), start_new_session=True)
    time.sleep(2)
    os.killpg(process.pid, signal.SIGINT)
    interrupted = time.monotonic()
    out, err = (stream.decode() for stream in process.communicate(timeout=60))
    assert (process.returncode, err, out) == (130, "python -m checks: interrupted\n", "")
    # At once: before, the run waited for the renders under way to spend their CPU budget (10 s).
    assert time.monotonic() - interrupted < 5


def test_a_folder_of_named_templates_alone_is_a_repository(tmp_path: Path) -> None:
    """A model folder whose templates are all in `additional_chat_templates/` (named, none
    `default`) is one repository, as `load_repository` and transformers read it: walked from
    above, it was two loose files, each checked as a default template."""
    named = tmp_path / "models" / "m" / "additional_chat_templates"
    named.mkdir(parents=True)
    (named / "rag.jinja").write_text(CHATML)
    (named / "tool_use.jinja").write_text(CHATML)
    [alone] = results(run(str(tmp_path / "models" / "m"), "--json"))
    [walked] = results(run(str(tmp_path / "models"), "--json"))
    assert walked["template_names"] == alone["template_names"] == ["rag", "tool_use"]
    assert walked["verdict"] == alone["verdict"] == "safe_where_renderable"
