"""GGUF files for tests, written by gguf's own GGUFWriter: metadata and one tiny tensor."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

QWEN_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "hello", "world"]


def gguf_bytes(
    template: str | None,
    *,
    arch: str = "qwen3",
    tokens: list[str] | None = None,
    bos_id: int | None = 0,
    eos_id: int | None = 2,
    named: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
    name: str = "",
) -> bytes:
    """A complete GGUF file (a few hundred bytes plus the vocabulary) as the converters write it:
    general.*, the vocabulary, the special token ids, then the chat template."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.gguf"
        writer = GGUFWriter(str(path), arch)
        if name:
            writer.add_name(name)
        writer.add_context_length(4096)
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens if tokens is not None else QWEN_TOKENS)
        writer.add_token_merges(["h e", "he llo"])
        if bos_id is not None:
            writer.add_bos_token_id(bos_id)
        if eos_id is not None:
            writer.add_eos_token_id(eos_id)
        for key, value in (extra or {}).items():
            writer.add_string(key, value)
        if template is not None:
            writer.add_chat_template(template)
        for template_name, text in (named or {}).items():
            writer.add_string(f"tokenizer.chat_template.{template_name}", text)
        writer.add_tensor("output.weight", np.zeros((4, 4), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()
