"""What a repository's files say: its chat templates (transformers 5.x precedence), special
tokens and architecture facts. Pure functions over bytes; everything read is hostile."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from checks.sources import SourceError, special_tokens_from_config, templates_from_value

CHAT_TEMPLATE_JINJA = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_JSON = "chat_template.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
TOKENIZER_JSON = "tokenizer.json"
CONFIG_JSON = "config.json"

#: Files whose content decides the templates of a commit (downloaded when they change).
TEMPLATE_FILES = (CHAT_TEMPLATE_JINJA, TOKENIZER_CONFIG, CHAT_TEMPLATE_JSON, SPECIAL_TOKENS_MAP)
#: Paths compared commit to commit (by object id) to find where anything relevant changed.
WATCHED_PATHS = (*TEMPLATE_FILES, TEMPLATE_DIR, TOKENIZER_JSON)

MAX_NAMED_TEMPLATES = 32


class BrokenRepo(Exception):
    """The repo's files cannot be used as they are; the message is shown on the model page."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class FoundTemplates:
    """The templates of one commit and where they came from."""

    source_file: str
    default: str
    #: Every named template when the repo has several (`default`, `tool_use`, …), else empty.
    named: dict[str, str] = field(default_factory=dict)
    special_tokens: dict[str, str] = field(default_factory=dict)

    def identity(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """What a change compares: the default text and every named text, by SHA-256."""
        named = tuple(sorted((name, sha256_text(text)) for name, text in self.named.items()))
        return (sha256_text(self.default), named)


def decode_text(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BrokenRepo(f"{path} is not valid UTF-8 (bad byte at offset {err.start})") from None


def parse_json(path: str, data: bytes) -> Any:
    text = decode_text(path, data)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BrokenRepo(
            f"{path} is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
        ) from None
    except RecursionError:
        raise BrokenRepo(f"{path} is not valid JSON: nested too deeply") from None


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _templates_from_value(path: str, value: object) -> tuple[str, dict[str, str]] | None:
    """A `chat_template` value: (default, named) or None when empty; raises BrokenRepo."""
    if value is None or value == [] or (isinstance(value, str) and not value.strip()):
        return None
    try:
        templates = templates_from_value(value, path)
    except SourceError as err:
        raise BrokenRepo(str(err)) from None
    if len(templates) > MAX_NAMED_TEMPLATES:
        raise BrokenRepo(f"{path}: more than {MAX_NAMED_TEMPLATES} named chat templates")
    default = templates.get("default", templates[sorted(templates)[0]])
    return default, (templates if len(templates) > 1 else {})


def _json_object(path: str, data: bytes) -> dict[str, Any]:
    value = parse_json(path, data)
    if not isinstance(value, dict):
        raise BrokenRepo(f"{path} is {_type_name(value)}, not a JSON object")
    return value


def special_tokens(config: dict[str, Any], fallback: dict[str, Any] | None) -> dict[str, str]:
    """Named special tokens from tokenizer_config.json, else special_tokens_map.json."""
    tokens = special_tokens_from_config(fallback or {})
    tokens.update(special_tokens_from_config(config))
    return tokens


def find_templates(files: dict[str, bytes]) -> FoundTemplates | None:
    """The templates these files define (None: no chat template); raises BrokenRepo.

    `files` maps repo paths to bytes: any of TEMPLATE_FILES and additional_chat_templates/*.jinja.
    Precedence (transformers 5.x, CHECKS.md §3): chat_template.jinja and additional templates,
    then tokenizer_config.json, then the processors' legacy chat_template.json.
    """
    tokenizer_config: dict[str, Any] = {}
    if TOKENIZER_CONFIG in files:
        tokenizer_config = _json_object(TOKENIZER_CONFIG, files[TOKENIZER_CONFIG])
    fallback: dict[str, Any] | None = None
    if SPECIAL_TOKENS_MAP in files:
        try:
            fallback = _json_object(SPECIAL_TOKENS_MAP, files[SPECIAL_TOKENS_MAP])
        except BrokenRepo:
            fallback = None  # only a fallback for tokens: a bad one does not break the template
    tokens = special_tokens(tokenizer_config, fallback)

    named: dict[str, str] = {}
    if CHAT_TEMPLATE_JINJA in files:
        named["default"] = decode_text(CHAT_TEMPLATE_JINJA, files[CHAT_TEMPLATE_JINJA])
    extra = sorted(p for p in files if p.startswith(TEMPLATE_DIR + "/") and p.endswith(".jinja"))
    if len(extra) > MAX_NAMED_TEMPLATES:
        raise BrokenRepo(f"{TEMPLATE_DIR}/ holds more than {MAX_NAMED_TEMPLATES} templates")
    for path in extra:
        named[path.removeprefix(TEMPLATE_DIR + "/").removesuffix(".jinja")] = decode_text(
            path, files[path]
        )
    if named:
        source = CHAT_TEMPLATE_JINJA if CHAT_TEMPLATE_JINJA in files else TEMPLATE_DIR
        default = named.get("default", named[sorted(named)[0]])
        return FoundTemplates(source, default, named if len(named) > 1 else {}, tokens)

    found = _templates_from_value(TOKENIZER_CONFIG, tokenizer_config.get("chat_template"))
    if found is not None:
        return FoundTemplates(TOKENIZER_CONFIG, found[0], found[1], tokens)

    if CHAT_TEMPLATE_JSON in files:
        processor = _json_object(CHAT_TEMPLATE_JSON, files[CHAT_TEMPLATE_JSON])
        found = _templates_from_value(CHAT_TEMPLATE_JSON, processor.get("chat_template"))
        if found is not None:
            return FoundTemplates(CHAT_TEMPLATE_JSON, found[0], found[1], tokens)
    return None


# --- config.json ---------------------------------------------------------------------------

#: Attention layer kinds that keep a trimmable KV cache (everything else is recurrent/linear).
ATTENTION_LAYERS = frozenset(
    {
        "attention",
        "full_attention",
        "global_attention",
        "sliding_attention",
        "sliding_window_attention",
        "chunked_attention",
        "local_attention",
        "full",
        "global",
        "local",
        "sliding",
    }
)
SLIDING_LAYERS = frozenset(
    {"sliding_attention", "sliding_window_attention", "chunked_attention", "local_attention"}
    | {"local", "sliding"}
)
#: Architectures with recurrent / state-space / linear-attention layers (CHECKS.md §1).
RECURRENT_MODEL_TYPES = frozenset(
    {
        "bamba",
        "falcon_h1",
        "falcon_mamba",
        "granitemoehybrid",
        "jamba",
        "lfm2",
        "lfm2_moe",
        "lfm2_vl",
        "mamba",
        "mamba2",
        "minimax",
        "nemotron_h",
        "plamo2",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_5_text",
        "qwen3_next",
        "recurrent_gemma",
        "rwkv",
        "rwkv5",
        "rwkv6",
        "rwkv7",
        "zamba",
        "zamba2",
    }
)
NESTED_CONFIGS = ("text_config", "language_config", "llm_config")


@dataclass(frozen=True)
class ArchitectureFacts:
    model_type: str = ""
    architectures: tuple[str, ...] = ()
    is_hybrid: bool = False
    has_sliding_window: bool = False
    quantization: str = ""


def _layer_kinds(config: dict[str, Any]) -> list[str]:
    kinds: list[str] = []
    for key in ("layer_types", "layers_block_type", "block_types"):
        value = config.get(key)
        if isinstance(value, list):
            kinds += [str(v).lower() for v in value if isinstance(v, str)]
    return kinds


def _is_recurrent(config: dict[str, Any]) -> bool:
    if str(config.get("model_type", "")).lower() in RECURRENT_MODEL_TYPES:
        return True
    if any(kind not in ATTENTION_LAYERS for kind in _layer_kinds(config)):
        return True
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and "M" in pattern:
        return True
    return any(
        key in config
        for key in ("mamba_d_state", "ssm_state_size", "mamba_expand", "full_attn_idxs")
    )


def _has_sliding_window(config: dict[str, Any]) -> bool:
    if any(kind in SLIDING_LAYERS for kind in _layer_kinds(config)):
        return True
    if isinstance(config.get("attention_chunk_size"), int):
        return True
    window = config.get("sliding_window")
    return (
        isinstance(window, int)
        and not isinstance(window, bool)
        and window > 0
        and config.get("use_sliding_window", True) is not False
    )


def _quantization(config: dict[str, Any], tags: list[str]) -> str:
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method") or "quantized")
        bits = quant.get("bits")
        if quant.get("load_in_4bit"):
            bits = 4
        elif quant.get("load_in_8bit"):
            bits = 8
        return f"{method} {bits}-bit" if isinstance(bits, int) else method
    mlx = config.get("quantization")
    if isinstance(mlx, dict) and isinstance(mlx.get("bits"), int):
        return f"mlx {mlx['bits']}-bit"
    if "gguf" in tags:
        return "gguf"
    return ""


def architecture_facts(config_bytes: bytes | None, tags: list[str]) -> ArchitectureFacts:
    """Model type, architectures, hybrid / sliding-window layers and quantization; raises
    BrokenRepo when config.json exists but is not a JSON object."""
    if config_bytes is None:
        return ArchitectureFacts(quantization=_quantization({}, tags))
    config = _json_object(CONFIG_JSON, config_bytes)
    configs = [config] + [c for key in NESTED_CONFIGS if isinstance(c := config.get(key), dict)]
    architectures = config.get("architectures")
    return ArchitectureFacts(
        model_type=str(config.get("model_type") or "")[:100],
        architectures=tuple(str(a)[:200] for a in architectures[:20])
        if isinstance(architectures, list)
        else (),
        is_hybrid=any(_is_recurrent(c) for c in configs),
        has_sliding_window=any(_has_sliding_window(c) for c in configs),
        quantization=_quantization(config, tags)[:100],
    )
