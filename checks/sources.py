"""Where a model's chat template comes from: parse the files a repository publishes.

Precedence follows transformers 5.x: `chat_template.jinja` (+ `additional_chat_templates/*.jinja`)
wins over `tokenizer_config.json` `"chat_template"`, which wins over a legacy `chat_template.json`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Special tokens transformers exposes to templates by name when the tokenizer defines them.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class SourceError(ValueError):
    """The input is not a usable chat template source; the message says why."""


@dataclass(frozen=True)
class TemplateSource:
    """One model's chat template(s), its special tokens, and which file they came from."""

    templates: dict[str, str]
    special_tokens: dict[str, str] = field(default_factory=dict)
    origin: str = "string"
    sha256: str = ""

    def __post_init__(self) -> None:
        if not self.templates:
            raise SourceError("no chat template found")
        if not self.sha256:
            object.__setattr__(self, "sha256", sha256_of_templates(self.templates))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.templates)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def sha256_of_templates(templates: dict[str, str]) -> str:
    """A single template hashes as its text; named templates hash as their canonical JSON."""
    if list(templates) == ["default"]:
        return sha256_text(templates["default"])
    return sha256_text(json.dumps(templates, sort_keys=True, ensure_ascii=False))


def decode_text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{name} is not valid UTF-8 (byte {exc.start})") from exc


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as strings or as AddedToken dicts.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def special_tokens_from_config(config: dict[str, Any]) -> dict[str, str]:
    tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _token_text(config.get(name))
        if text is not None:
            tokens[name] = text
    return tokens


def templates_from_value(value: Any, name: str) -> dict[str, str]:
    """A `chat_template` value: a string, or a list of {name, template} entries."""
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and value:
        templates: dict[str, str] = {}
        for entry in value:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                raise SourceError(
                    f"{name}: chat_template list entries must be {{name, template}} strings"
                )
            templates[entry["name"]] = entry["template"]
        return templates
    kind = type(value).__name__ if value is not None else "missing"
    raise SourceError(f"{name}: chat_template must be a string or a named list, got {kind}")


def parse_json_object(text: str, name: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SourceError(f"{name} must hold a JSON object")
    return data


def source_from_config_text(text: str, name: str = "tokenizer_config.json") -> TemplateSource:
    """Parse the text of a tokenizer_config.json (or a legacy chat_template.json)."""
    config = parse_json_object(text, name)
    templates = templates_from_value(config.get("chat_template"), name)
    return TemplateSource(templates, special_tokens_from_config(config), origin=name)


def source_from_template_text(
    text: str,
    name: str = "chat_template.jinja",
    special_tokens: dict[str, str] | None = None,
) -> TemplateSource:
    return TemplateSource({"default": text}, dict(special_tokens or {}), origin=name)


def read_text(path: Path) -> str:
    """The exact text of a file; unreadable or non-UTF-8 files raise SourceError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {path.name}: {exc.strerror}") from exc
    return decode_text(data, path.name)


def load_source(path: Path, special_tokens: dict[str, str] | None = None) -> TemplateSource:
    """Load one file: a `.jinja` template or a JSON config; raises SourceError when unusable."""
    text = read_text(path)
    if path.suffix == ".json":
        source = source_from_config_text(text, path.name)
        if special_tokens and not source.special_tokens:
            return TemplateSource(source.templates, dict(special_tokens), origin=source.origin)
        return source
    return source_from_template_text(text, path.name, special_tokens)


def load_repository(directory: Path) -> TemplateSource:
    """Load a model repository snapshot with transformers' precedence between files."""
    config_path = directory / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        config = parse_json_object(read_text(config_path), config_path.name)
    tokens = special_tokens_from_config(config)
    jinja_path = directory / "chat_template.jinja"
    if jinja_path.is_file():
        templates = {"default": read_text(jinja_path)}
        extra_dir = directory / "additional_chat_templates"
        if extra_dir.is_dir():
            for extra in sorted(extra_dir.glob("*.jinja")):
                templates[extra.stem] = read_text(extra)
        return TemplateSource(templates, tokens, origin=jinja_path.name)
    if "chat_template" in config:
        templates = templates_from_value(config["chat_template"], config_path.name)
        return TemplateSource(templates, tokens, origin=config_path.name)
    legacy = directory / "chat_template.json"
    if legacy.is_file():
        legacy_config = parse_json_object(read_text(legacy), legacy.name)
        templates = templates_from_value(legacy_config.get("chat_template"), legacy.name)
        return TemplateSource(templates, tokens, origin=legacy.name)
    raise SourceError(
        f"{directory.name}: no chat_template.jinja, tokenizer_config.json template "
        "or chat_template.json"
    )
