"""Where a model's chat template comes from: parse the files a repository publishes.

Precedence follows transformers 5.x: `chat_template.jinja` (+ `additional_chat_templates/*.jinja`)
wins over `tokenizer_config.json` `"chat_template"`, which wins over a legacy `chat_template.json`;
special tokens come from `tokenizer_config.json`, else `special_tokens_map.json`. This module is
the one place that rule is written: the CLI (`load_repository`), the registry's sync and its local
import (`find_templates` over the files of a commit) all call it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHAT_TEMPLATE_JINJA = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_JSON = "chat_template.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
#: Files whose content decides a repository's templates (besides TEMPLATE_DIR/*.jinja).
TEMPLATE_FILES = (CHAT_TEMPLATE_JINJA, TOKENIZER_CONFIG, CHAT_TEMPLATE_JSON, SPECIAL_TOKENS_MAP)
MAX_NAMED_TEMPLATES = 32
#: The template transformers renders when the caller names none; `tool_use` it prefers for a
#: request that passes tools.
DEFAULT = "default"
TOOL_USE = "tool_use"

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
    #: Special tokens that stand in for the model's own (a `.jinja` file with no config beside
    #: it): the report says so, since a real tokenizer's tokens may render differently.
    placeholder_tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.templates:
            raise SourceError("no chat template found")
        if not self.sha256:
            object.__setattr__(self, "sha256", sha256_of_templates(self.templates))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.templates)


def has_default(names: Collection[str]) -> bool:
    """Does a caller who names no template get one for every request? Yes for a single template
    (or none listed by name); named templates need one named `default`, else transformers
    raises ValueError for a request without tools (and takes `tool_use` for one with tools)."""
    return not names or DEFAULT in names


def unnamed_choice(names: Collection[str], passes_tools: bool) -> str | None:
    """The template transformers' `get_chat_template` takes for a caller who names none:
    `tool_use` when tools are passed (`tools is not None`: an empty list too), else `default`;
    None where it raises."""
    if passes_tools and TOOL_USE in names:
        return TOOL_USE
    return DEFAULT if DEFAULT in names else None


def no_default_error(names: Collection[str]) -> str:
    """What transformers' `apply_chat_template` raises (ValueError) for a request without tools
    when named templates have no `default` and the caller names none."""
    return (
        "This model has multiple chat templates with no default specified! Please either pass a "
        "chat template or the name of the template you wish to use to the `chat_template` "
        f"argument. Available template names are {sorted(names)}."
    )


def sha256_text(text: str) -> str:
    """The SHA-256 of a template's UTF-8 bytes: the one hash of template text everywhere.

    `surrogatepass`: a JSON config can write a lone surrogate (`"\\ud800"`) into a template,
    and its hash must not raise.
    """
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
        raise SourceError(f"{name} is not valid UTF-8 (byte {exc.start})") from None


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


def _unicode_text(text: str, name: str) -> str:
    """JSON can escape a lone surrogate (`"\\ud800"`) into a string that no UTF-8 encoder, and
    so no tokenizer or database, accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = f"\\u{ord(text[exc.start]):04x}"
        raise SourceError(
            f"{name}: chat_template holds a lone surrogate ({bad}), which is not valid Unicode"
        ) from None
    return text


def templates_from_value(value: Any, name: str) -> dict[str, str]:
    """A `chat_template` value: a string, or a list of {name, template} entries."""
    if isinstance(value, str):
        return {"default": _unicode_text(value, name)}
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
            templates[entry["name"]] = _unicode_text(entry["template"], name)
        return templates
    if value is None:
        raise SourceError(f"{name}: has no chat_template (the key is missing or null)")
    kind = type(value).__name__
    raise SourceError(f"{name}: chat_template must be a string or a named list, got {kind}")


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SourceError(
            f"{name} is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
        ) from None
    except RecursionError:
        raise SourceError(f"{name} is not valid JSON: nested too deeply") from None
    except ValueError as err:  # e.g. an integer past Python's limit on digits (4,300)
        raise SourceError(f"{name} is not valid JSON here: {str(err)[:120]}") from None


def parse_json_object(text: str, name: str) -> dict[str, Any]:
    data = parse_json(text, name)
    if not isinstance(data, dict):
        raise SourceError(f"{name} is {_type_name(data)}, not a JSON object")
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


#: What a lone `.jinja` file renders with when nothing says what its model's tokens are; most
#: templates write `bos_token` (many concatenate it, which fails when it is undefined).
PLACEHOLDER_TOKENS = {"bos_token": "<|placeholder_bos|>", "eos_token": "<|placeholder_eos|>"}


def tokens_beside(path: Path) -> tuple[dict[str, str], set[str]]:
    """The special tokens of the tokenizer_config.json (or special_tokens_map.json) in the
    template's folder, and the names it sets to null (Qwen's `"bos_token": null`: the model has
    none, and transformers leaves it undefined); nothing when there is none or it is unusable
    (the template still is)."""
    files = {}
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        if (path.parent / name).is_file():
            with contextlib.suppress(OSError):
                files[name] = (path.parent / name).read_bytes()
    tokens: dict[str, str] = {}
    absent: set[str] = set()
    for name in (SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG):  # the config wins
        if name in files:
            with contextlib.suppress(SourceError):
                config = _json_file(files, name)
                tokens.update(special_tokens_from_config(config))
                absent |= {t for t in SPECIAL_TOKEN_NAMES if t in config and config[t] is None}
    return tokens, absent - tokens.keys()


def load_source(path: Path, special_tokens: dict[str, str] | None = None) -> TemplateSource:
    """Load one file: a `.jinja` template or a JSON config; raises SourceError when unusable.

    A `.jinja` file given without tokens takes them from a config beside it, else renders with
    clearly marked placeholders for `bos_token` / `eos_token` (`placeholder_tokens` says which).
    """
    text = read_text(path)
    if path.suffix == ".json":
        source = source_from_config_text(text, path.name)
        if special_tokens and not source.special_tokens:
            return TemplateSource(source.templates, dict(special_tokens), origin=source.origin)
        return source
    if special_tokens is not None:
        return source_from_template_text(text, path.name, special_tokens)
    tokens, absent = tokens_beside(path)
    missing = {
        name: value
        for name, value in PLACEHOLDER_TOKENS.items()
        if name not in tokens and name not in absent
    }
    return TemplateSource(
        {"default": text},
        {**missing, **tokens},
        origin=path.name,
        placeholder_tokens=tuple(missing),
    )


@dataclass(frozen=True)
class FoundTemplates:
    """The templates of one repository commit and the file they came from."""

    source_file: str
    #: The `default` template; when named templates have none (`has_default`), the first by name
    #: stands in for it, as the registry has always filed it (its pages never call it the default).
    default: str
    #: Every named template when the repo has several (`default`, `tool_use`, …) or a lone one
    #: not named `default`, else empty.
    named: dict[str, str] = field(default_factory=dict)
    special_tokens: dict[str, str] = field(default_factory=dict)

    def identity(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """What a change compares: the default text and every named text, by SHA-256."""
        named = tuple(sorted((name, sha256_text(text)) for name, text in self.named.items()))
        return (sha256_text(self.default), named)

    def source(self) -> TemplateSource:
        """As the engine takes it: every template by name, the tokens, the winning file."""
        templates = self.named or {"default": self.default}
        return TemplateSource(dict(templates), dict(self.special_tokens), origin=self.source_file)


def _found_in_value(path: str, value: object) -> tuple[str, dict[str, str]] | None:
    """A `chat_template` value: (default, named) or None when empty; raises SourceError."""
    if value is None or value == [] or (isinstance(value, str) and not value.strip()):
        return None
    templates = templates_from_value(value, path)
    if len(templates) > MAX_NAMED_TEMPLATES:
        raise SourceError(f"{path}: more than {MAX_NAMED_TEMPLATES} named chat templates")
    return _stand_in(templates), _named(templates)


def _stand_in(templates: dict[str, str]) -> str:
    """`FoundTemplates.default`: the one named `default`, else the first by name."""
    return templates.get(DEFAULT, templates[sorted(templates)[0]])


def _named(templates: dict[str, str]) -> dict[str, str]:
    """Named templates as transformers keeps them: a dict whatever their number, unless the
    only one is `default` (a lone `tool_use` is no default)."""
    return {} if list(templates) == [DEFAULT] else templates


def _json_file(files: Mapping[str, bytes], path: str) -> dict[str, Any]:
    return parse_json_object(decode_text(files[path], path), path)


def find_templates(files: Mapping[str, bytes]) -> FoundTemplates | None:
    """The templates these files define (None: no chat template); raises SourceError.

    `files` maps repository paths to bytes: any of TEMPLATE_FILES and
    `additional_chat_templates/*.jinja`. Everything in them is hostile.
    """
    config: dict[str, Any] = {}
    if TOKENIZER_CONFIG in files:
        config = _json_file(files, TOKENIZER_CONFIG)
    fallback: dict[str, Any] = {}
    if SPECIAL_TOKENS_MAP in files:
        # Only a fallback for tokens: a bad one does not break the template.
        with contextlib.suppress(SourceError):
            fallback = _json_file(files, SPECIAL_TOKENS_MAP)
    tokens = special_tokens_from_config(fallback)
    tokens.update(special_tokens_from_config(config))

    named: dict[str, str] = {}
    if CHAT_TEMPLATE_JINJA in files:
        named["default"] = decode_text(files[CHAT_TEMPLATE_JINJA], CHAT_TEMPLATE_JINJA)
    extra = sorted(p for p in files if p.startswith(TEMPLATE_DIR + "/") and p.endswith(".jinja"))
    if len(extra) > MAX_NAMED_TEMPLATES:
        raise SourceError(f"{TEMPLATE_DIR}/ holds more than {MAX_NAMED_TEMPLATES} templates")
    for path in extra:
        name = path.removeprefix(TEMPLATE_DIR + "/").removesuffix(".jinja")
        named[name] = decode_text(files[path], path)
    if named:
        source = CHAT_TEMPLATE_JINJA if CHAT_TEMPLATE_JINJA in files else TEMPLATE_DIR
        return FoundTemplates(source, _stand_in(named), _named(named), tokens)

    found = _found_in_value(TOKENIZER_CONFIG, config.get("chat_template"))
    if found is not None:
        return FoundTemplates(TOKENIZER_CONFIG, found[0], found[1], tokens)
    if CHAT_TEMPLATE_JSON in files:
        processor = _json_file(files, CHAT_TEMPLATE_JSON)
        found = _found_in_value(CHAT_TEMPLATE_JSON, processor.get("chat_template"))
        if found is not None:
            return FoundTemplates(CHAT_TEMPLATE_JSON, found[0], found[1], tokens)
    return None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {path.name}: {exc.strerror}") from exc


def load_repository(directory: Path) -> TemplateSource:
    """Load a model repository folder with transformers' precedence between files."""
    files = {name: _read_bytes(directory / name) for name in TEMPLATE_FILES
             if (directory / name).is_file()}  # fmt: skip
    extra_dir = directory / TEMPLATE_DIR
    if extra_dir.is_dir():
        for extra in sorted(extra_dir.glob("*.jinja")):
            files[f"{TEMPLATE_DIR}/{extra.name}"] = _read_bytes(extra)
    found = find_templates(files)
    if found is None:
        raise SourceError(
            f"{directory.name}: no chat_template.jinja, tokenizer_config.json template "
            "or chat_template.json"
        )
    return found.source()
