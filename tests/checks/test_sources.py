"""Where a model's template comes from, as transformers 5.x decides, hashed byte for byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from checks.sources import SourceError, find_templates, load_repository, load_source, sha256_text
from tests.checks.conftest import CHATML

CRLF_TEMPLATE = b"{% for m in messages %}{{ m.content }}\r\n{% endfor %}"


def test_jinja_file_wins_and_additional_templates_are_named(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_bytes(CRLF_TEMPLATE)
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "rag.jinja").write_text("{{ documents }}")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "ignored",
                "bos_token": {"content": "<s>", "lstrip": False},
                "eos_token": "</s>",
                "pad_token": None,
            }
        )
    )
    source = load_repository(tmp_path)
    assert source.origin == "chat_template.jinja"
    assert source.names == ("default", "rag")
    assert source.templates["default"].encode() == CRLF_TEMPLATE  # CRLF kept
    assert source.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}


def test_config_then_legacy_processor_file(tmp_path: Path) -> None:
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "legacy"}))
    assert load_repository(tmp_path).origin == "chat_template.json"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "config"}))
    source = load_repository(tmp_path)
    assert (source.origin, source.templates) == ("tokenizer_config.json", {"default": "config"})


def test_sha256_is_of_the_exact_template_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_bytes(CRLF_TEMPLATE)
    assert load_source(path).sha256 == hashlib.sha256(CRLF_TEMPLATE).hexdigest()


def test_named_list_keeps_its_names_and_order(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer_config.json"
    entries = [{"name": "tool_use", "template": "b"}, {"name": "default", "template": "a"}]
    path.write_text(json.dumps({"chat_template": entries}))
    assert load_source(path).names == ("tool_use", "default")


@pytest.mark.parametrize(
    "files",
    [
        {"tokenizer_config.json": [{"name": "tool_use", "template": "t"}]},
        {"additional_chat_templates/tool_use.jinja": "t"},
    ],
    ids=["config-list", "additional-folder"],
)
def test_a_lone_named_template_is_no_default(tmp_path: Path, files: dict[str, object]) -> None:
    """transformers makes named templates a dict whatever their number (a config's list, or the
    folder's files without chat_template.jinja): a lone `tool_use` is not a default, and a
    request without tools needs its name. The folder, its config and a commit's files agree."""
    data = {
        path: (json.dumps({"chat_template": value}) if path.endswith(".json") else str(value))
        for path, value in files.items()
    }
    for path, text in data.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text)
    found = find_templates({path: text.encode() for path, text in data.items()})
    assert found is not None
    assert found.named == {"tool_use": "t"}
    assert load_repository(tmp_path) == found.source()
    assert found.source().templates == {"tool_use": "t"}
    if "tokenizer_config.json" in data:
        assert load_source(tmp_path / "tokenizer_config.json").templates == {"tool_use": "t"}


def test_repository_without_a_template_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(SourceError, match="no chat_template.jinja"):
        load_repository(tmp_path)


def test_a_folder_and_a_commits_files_follow_one_rule(tmp_path: Path) -> None:
    """The CLI reads a folder and the registry a commit's files: same templates, same tokens
    (special_tokens_map.json is the fallback in both)."""
    files = {
        "tokenizer_config.json": json.dumps({"chat_template": "{{ bos_token }}x"}).encode(),
        "special_tokens_map.json": json.dumps({"bos_token": {"content": "<s>"}}).encode(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    found = find_templates(files)
    assert found is not None
    assert load_repository(tmp_path) == found.source()
    assert found.source().special_tokens == {"bos_token": "<s>"}


def test_one_hash_for_template_text_even_with_a_lone_surrogate() -> None:
    text = json.loads('"{{ x }}\\ud800"')
    assert sha256_text(text) == hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    with pytest.raises(SourceError, match="lone surrogate"):
        find_templates({"tokenizer_config.json": json.dumps({"chat_template": text}).encode()})


def test_a_config_beside_a_jinja_with_no_bos_token_gets_no_placeholder(tmp_path: Path) -> None:
    """Qwen-style configs say `"bos_token": null`: transformers then leaves `bos_token`
    undefined (renders ""), as the repository folder's own check does; the lone .jinja of that
    folder renders `<|placeholder_bos|>` instead and says no config is beside it."""
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": None, "eos_token": "<|im_end|>"})
    )
    path = tmp_path / "chat_template.jinja"
    path.write_text("{{ bos_token }}" + CHATML)
    assert load_repository(tmp_path).special_tokens == {"eos_token": "<|im_end|>"}
    source = load_source(path)
    assert source.special_tokens == {"eos_token": "<|im_end|>"}
    assert source.placeholder_tokens == ()
