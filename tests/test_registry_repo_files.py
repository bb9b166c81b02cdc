"""What a repo's files say, without the network: precedence edge cases and config facts."""

from __future__ import annotations

import json

import pytest

from registry.repo_files import BrokenRepo, architecture_facts, find_templates


def config(**values: object) -> bytes:
    return json.dumps(values).encode()


@pytest.mark.parametrize(
    ("values", "hybrid", "sliding"),
    [
        ({"model_type": "llama"}, False, False),
        (
            {"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False},
            False,
            False,
        ),
        ({"model_type": "mistral", "sliding_window": 4096}, False, True),
        (
            {"model_type": "gemma3", "layer_types": ["sliding_attention", "full_attention"]},
            False,
            True,
        ),
        ({"model_type": "x", "layer_types": ["linear_attention", "full_attention"]}, True, False),
        ({"model_type": "jamba", "layers_block_type": ["mamba", "attention"]}, True, False),
        ({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-"}, True, False),
        ({"model_type": "llama4", "text_config": {"attention_chunk_size": 8192}}, False, True),
        (
            {"model_type": "qwen3_5", "text_config": {"layer_types": ["full_attention"]}},
            True,
            False,
        ),
    ],
)
def test_hybrid_and_sliding_window_layers(
    values: dict[str, object], hybrid: bool, sliding: bool
) -> None:
    facts = architecture_facts(config(**values), [])
    assert (facts.is_hybrid, facts.has_sliding_window) == (hybrid, sliding)


def test_quantization_from_config_or_tags() -> None:
    assert architecture_facts(config(quantization={"bits": 4}), []).quantization == "mlx 4-bit"
    awq = config(quantization_config={"quant_method": "awq", "bits": 4})
    assert architecture_facts(awq, []).quantization == "awq 4-bit"
    assert architecture_facts(None, ["gguf"]).quantization == "gguf"


def test_config_json_that_is_not_an_object_is_broken() -> None:
    with pytest.raises(BrokenRepo, match="config.json is a list"):
        architecture_facts(b"[]", [])


def test_special_tokens_fall_back_to_special_tokens_map() -> None:
    found = find_templates(
        {
            "tokenizer_config.json": json.dumps(
                {"chat_template": "x", "eos_token": "<e>"}
            ).encode(),
            "special_tokens_map.json": json.dumps({"bos_token": {"content": "<b>"}}).encode(),
        }
    )
    assert found is not None
    assert found.special_tokens == {"bos_token": "<b>", "eos_token": "<e>"}


def test_empty_template_string_is_no_template() -> None:
    assert find_templates({"tokenizer_config.json": b'{"chat_template": "  "}'}) is None


def test_additional_templates_alone_pick_default_by_name() -> None:
    found = find_templates(
        {
            "additional_chat_templates/default.jinja": b"D",
            "additional_chat_templates/rag.jinja": b"R",
        }
    )
    assert found is not None
    assert (found.source_file, found.default, sorted(found.named)) == (
        "additional_chat_templates",
        "D",
        ["default", "rag"],
    )
