"""What a repository's files say to the registry: its chat templates (by the check engine's
precedence rule, `checks.sources`) and architecture facts. Pure functions over bytes; everything
read is hostile, and an unusable file is a BrokenRepo with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checks.sources import (
    CHAT_TEMPLATE_JINJA,
    CHAT_TEMPLATE_JSON,
    SPECIAL_TOKENS_MAP,
    TEMPLATE_DIR,
    TEMPLATE_FILES,
    TOKENIZER_CONFIG,
    FoundTemplates,
    SourceError,
    decode_text,
    parse_json_object,
    sha256_text,
)
from checks.sources import find_templates as _find_templates

from .storable import unstorable_text

TOKENIZER_JSON = "tokenizer.json"
CONFIG_JSON = "config.json"

#: Paths compared commit to commit (by object id) to find where anything relevant changed.
WATCHED_PATHS = (*TEMPLATE_FILES, TEMPLATE_DIR, TOKENIZER_JSON)

__all__ = [
    "CHAT_TEMPLATE_JINJA",
    "CHAT_TEMPLATE_JSON",
    "CONFIG_JSON",
    "SPECIAL_TOKENS_MAP",
    "TEMPLATE_DIR",
    "TEMPLATE_FILES",
    "TOKENIZER_CONFIG",
    "TOKENIZER_JSON",
    "WATCHED_PATHS",
    "BrokenRepo",
    "FoundTemplates",
    "architecture_facts",
    "config_facts",
    "find_templates",
    "sha256_text",
    "unstorable",
]


class BrokenRepo(Exception):
    """The repo's files cannot be used as they are; the message is shown on the model page."""


def find_templates(files: dict[str, bytes]) -> FoundTemplates | None:
    """The templates of a commit's files, by the check engine's precedence rule
    (`checks.sources.find_templates`); None when there is none, BrokenRepo when unusable,
    or when the catalog could not store them (`unstorable`)."""
    try:
        found = _find_templates(files)
    except SourceError as err:
        raise BrokenRepo(str(err)) from None
    if found is not None and (reason := unstorable(found)):
        raise BrokenRepo(reason)
    return found


#: The longest template name the catalog keeps (`NamedTemplate.name`).
MAX_TEMPLATE_NAME = 100


def unstorable(found: FoundTemplates, texts: tuple[str, ...] = ()) -> str:
    """Why the catalog cannot store these templates as they are ("" when it can): a name it
    cannot keep (empty, longer than `MAX_TEMPLATE_NAME`, or text it cannot store), or a
    template, one of `texts` or a special token it cannot store."""
    for name, text in found.named.items():
        if not 0 < len(name) <= MAX_TEMPLATE_NAME:
            return f"a template name must be 1 to {MAX_TEMPLATE_NAME} characters, not {len(name)}"
        reason = unstorable_text(name, "a template name") or unstorable_text(
            text, f"the template {name[:40]!r}"
        )
        if reason:
            return reason
    for text in (found.default, *texts):
        if reason := unstorable_text(text, "the chat template"):
            return reason
    for key, token in found.special_tokens.items():
        if reason := unstorable_text(token, key):
            return reason
    return ""


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
#: Architectures with recurrent / state-space / linear-attention layers: their cache cannot be
#: trimmed back to a shared prefix.
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
    try:
        config = parse_json_object(decode_text(config_bytes, CONFIG_JSON), CONFIG_JSON)
    except SourceError as err:
        raise BrokenRepo(str(err)) from None
    return config_facts(config, tags)


def config_facts(config: dict[str, Any], tags: list[str]) -> ArchitectureFacts:
    """The same facts from a parsed config (or the Hub's summary of one)."""
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
