"""Tiny models build offline and reload bit-exactly; the machine describes itself."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten

from probe.machine import describe_machine
from probe.tinymodels import ARCHITECTURES, build_tiny_model


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_builds_and_reloads_exactly(tmp_path: Path, arch: str) -> None:
    built = build_tiny_model(tmp_path / arch, arch, "qwen3", seed=3)
    loaded_model: Any = mlx_lm.load(str(built.path))
    model, tokenizer = loaded_model[0], loaded_model[1]
    saved: Any = mx.load(str(built.path / "model.safetensors"))
    loaded = dict(tree_flatten(model.parameters()))
    assert saved.keys() == loaded.keys()
    assert all(mx.array_equal(saved[k], loaded[k]).item() for k in saved)
    assert tokenizer.has_thinking
    assert tokenizer.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}


def test_unknown_architecture(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        build_tiny_model(tmp_path, "gpt99")


def test_machine_description() -> None:
    info = describe_machine()
    assert info["mlx"] == version("mlx")
    assert info["mlx_lm"] == version("mlx-lm")
    assert info["memory_bytes"] > 0
    assert info["chip"] and info["os"]
