"""Tiny random-weight models, built once per session, offline, and the conversations to probe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from probe.tinymodels import build_tiny_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def weather_conversation() -> dict[str, Any]:
    """Three requests: a reasoning reply then a new user turn, a tool call then its result."""
    r1 = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    r2 = [
        *r1,
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Look it up."},
        {"role": "user", "content": "And in London?"},
    ]
    r3 = [
        *r2,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "London"}'},
                }
            ],
        },
        {"role": "tool", "content": "rain, 12 C"},
    ]
    return {"requests": [r1, r2, r3], "tools": TOOLS}


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """(architecture, template) -> built model directory; ~0.1 s each."""
    root = tmp_path_factory.mktemp("tiny-models")
    built = {}
    for arch, template in [
        ("llama", "chatml"),
        ("llama", "qwen3"),
        ("qwen3_next", "qwen3"),
        ("llama_swa", "qwen3"),
    ]:
        built[f"{arch}/{template}"] = build_tiny_model(
            root / f"{arch}-{template}", arch, template
        ).path
    return built


def job(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A small job: one conversation, a ~256-token system prompt, one timing repeat."""
    return {
        "repo_id": "tiny/test",
        "revision": "0" * 40,
        "model_dir": str(model_dir),
        "conversations": {"weather": weather_conversation()},
        "prompt_sizes": [256],
        "paths": ["library", "library_checkpoints"],
        "repeats": 1,
        **overrides,
    }


def by_path(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Results keyed by (path, reply_mode)."""
    assert report["status"] == "ok", report.get("error")
    return {(r["path"], r["reply_mode"]): r for r in report["results"]}
