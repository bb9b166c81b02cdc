"""Tiny random-weight model directories that `mlx_lm.load` accepts, built offline in ~1 s.

Used by the tests, the benchmark and the CPU smoke mode. Nothing here downloads anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ChatML that writes every message the same way wherever it sits, reasoning included.
#: Appending a message never changes the bytes before it: cache-safe. Written like the real
#: Qwen templates (output only through `{{- '...' }}`) so trim_blocks cannot eat a newline.
_TOOLS_HEADER = """
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}"""

_OTHER_ROLES = """
{%- for tc in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{"name": "' + tc.function.name + '", "arguments": ' }}
{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content }}
{{- '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}"""

CHATML_SAFE_TEMPLATE = (
    _TOOLS_HEADER
    + """
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.reasoning_content %}
{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
{%- endif %}
{{- message.content or '' }}"""
    + _OTHER_ROLES
    + """
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
)

#: The Qwen3 template's history logic: reasoning is kept only after the last user query, so
#: the reply the model emitted (with `<think>`) is rewritten once a new user turn arrives.
QWEN3_STRIPS_REASONING_TEMPLATE = (
    _TOOLS_HEADER
    + """
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == 'user' %}
{%- set ns.multi_step_tool = false %}
{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}
{%- set reasoning = message.reasoning_content or '' %}
{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}
{{- (message.content or '').lstrip('\\n') }}
{%- else %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- endif %}"""
    + _OTHER_ROLES
    + """
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}"""
)

TEMPLATES = {"chatml": CHATML_SAFE_TEMPLATE, "qwen3": QWEN3_STRIPS_REASONING_TEMPLATE}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: Added but not special, as in Qwen3: they must survive decoding.
PLAIN_ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

_BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": 1024,
    "max_position_embeddings": 65536,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}

#: Architectures by name: what each one's cache is made of is the point of the choice.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Dense: one KVCache per layer, trimmable.
    "llama": {**_BASE, "model_type": "llama", "num_hidden_layers": 2},
    "qwen3": {**_BASE, "model_type": "qwen3", "num_hidden_layers": 2},
    # Sliding-window layers: RotatingKVCache, trimmable only until the window fills.
    "llama_swa": {
        **_BASE,
        "model_type": "llama",
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 64,
    },
    # Hybrid Gated-DeltaNet + attention: ArraysCache layers never trim.
    "qwen3_next": {
        **_BASE,
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 64,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "partial_rotary_factor": 0.5,
        "norm_topk_prob": True,
    },
}

_CORPUS_WORDS = [
    "the",
    "cache",
    "prompt",
    "token",
    "model",
    "reply",
    "user",
    "assistant",
    "system",
    "tool",
    "call",
    "result",
    "weather",
    "city",
    "reasoning",
    "think",
    "answer",
    "question",
    "file",
    "read",
    "write",
    "list",
    "search",
    "function",
    "arguments",
    "name",
    "json",
    "value",
    "error",
    "status",
    "ok",
    "true",
    "false",
    "null",
    "temperature",
    "paris",
    "london",
    "tokyo",
    "berlin",
    "code",
    "python",
    "def",
    "return",
    "import",
    "class",
    "self",
    "data",
    "request",
    "response",
    "server",
    "client",
    "layer",
    "state",
    "window",
]


@dataclass(frozen=True)
class TinyModel:
    """A built model directory and what it was built from."""

    path: Path
    architecture: str
    template: str


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(PLAIN_ADDED_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Deterministic corpus: the same vocabulary on every machine, so token counts transfer.
    lines = []
    for i in range(400):
        words = [_CORPUS_WORDS[(i * 7 + j * 13) % len(_CORPUS_WORDS)] for j in range(12)]
        lines.append(" ".join(words) + f' {{"id": {i}, "ok": true}}\n')
    tok.train_from_iterator(lines, trainer=trainer)
    tok.add_tokens(PLAIN_ADDED_TOKENS)
    return tok


def write_tokenizer(dest: Path, template: str, vocab_size: int = 1024) -> int:
    """Write tokenizer.json and a tokenizer_config.json carrying the chat template.

    Returns the real vocabulary size (the small corpus may not fill `vocab_size`).
    """
    tok = _train_tokenizer(vocab_size)
    tok.save(str(dest / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "special": t in SPECIAL_TOKENS,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for t in SPECIAL_TOKENS + PLAIN_ADDED_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "chat_template": TEMPLATES.get(template, template),
        "added_tokens_decoder": added,
        "model_max_length": 131072,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return int(tok.get_vocab_size())


def build_tiny_model(
    dest: Path, architecture: str = "llama", template: str = "chatml", seed: int = 0
) -> TinyModel:
    """Build a random-weight model directory at `dest` (created) that `mlx_lm.load` accepts.

    `template` is a key of TEMPLATES or a Jinja chat template text.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {architecture!r}: {sorted(ARCHITECTURES)}")
    dest.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(dest, template, int(ARCHITECTURES[architecture]["vocab_size"]))
    # The model's vocabulary matches the tokenizer's: a random model must not emit ids
    # that decode to nothing.
    config = {**ARCHITECTURES[architecture], "vocab_size": vocab_size}
    config["eos_token_id"] = SPECIAL_TOKENS.index("<|im_end|>")
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.save_safetensors(str(dest / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return TinyModel(dest, architecture, template if template in TEMPLATES else "custom")
