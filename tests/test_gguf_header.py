"""The GGUF header reader against gguf's own writer and reader, and against hostile bytes."""

from __future__ import annotations

import contextlib
import struct
import tempfile
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.gguf_header import FIRST_CHUNK, TOKENS_KEY, GgufError, read_bytes, read_metadata
from tests.gguf_files import QWEN_TOKENS, gguf_bytes

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)


def reference_fields(data: bytes) -> dict[str, object]:
    """What gguf's GGUFReader reads from the same bytes (scalars, strings, array lengths)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.gguf"
        path.write_bytes(data)
        reader = GGUFReader(str(path))
        found: dict[str, object] = {}
        for key, item in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            if item.types[0] == GGUFValueType.ARRAY:
                found[key] = len(item.data)
            elif item.types[0] == GGUFValueType.STRING:
                found[key] = bytes(item.parts[item.data[0]]).decode()
            else:
                found[key] = item.parts[item.data[0]].tolist()[0]
        return found


def test_it_reads_what_gguf_writes_as_gguf_reads_it() -> None:
    data = gguf_bytes(TEMPLATE, named={"tool_use": "{{ tools }}"}, name="Qwen3 8B")
    meta = read_bytes(data)
    assert meta.values == pytest.approx(reference_fields(data))
    assert meta.version == 3
    assert meta.tensor_count == 1
    assert meta.architecture == "qwen3"
    assert meta.chat_template == TEMPLATE
    assert meta.named_templates == {"tool_use": "{{ tools }}"}
    assert meta.values[TOKENS_KEY] == len(QWEN_TOKENS)
    assert meta.special_tokens == {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    assert meta.header_bytes < len(data)


def test_a_file_without_a_template_or_token_ids_reads_as_empty() -> None:
    meta = read_bytes(gguf_bytes(None, bos_id=None, eos_id=99))
    assert meta.chat_template == ""
    assert meta.special_tokens == {}  # id 99 is outside the five-token vocabulary


def test_only_the_header_is_fetched_in_growing_ranges() -> None:
    tokens = [f"token-{i:06d}" for i in range(60_000)]  # about 1.2 MB of vocabulary
    weights = b"\0" * (4 * 1024 * 1024)  # what a real file carries after the header
    data = gguf_bytes(TEMPLATE, tokens=tokens) + weights
    asked: list[tuple[int, int]] = []

    def fetch(start: int, size: int) -> bytes:
        asked.append((start, size))
        return data[start : start + size]

    meta = read_metadata(fetch, 32 * 1024 * 1024)
    assert meta.chat_template == TEMPLATE
    assert meta.values[TOKENS_KEY] == 60_000
    contiguous = [sum(size for _, size in asked[:i]) for i in range(len(asked))]
    assert [start for start, _ in asked] == contiguous
    assert asked[0] == (0, FIRST_CHUNK)
    assert len(asked) <= 4  # 256 KiB, 512 KiB, 1 MiB, 2 MiB
    assert meta.header_bytes <= meta.bytes_read < meta.header_bytes + 2 * 1024 * 1024 + 1
    assert meta.bytes_read < len(data) - len(weights) // 2


def test_the_cap_bounds_the_bytes_read() -> None:
    data = gguf_bytes(TEMPLATE, tokens=[f"t{i}" for i in range(50_000)])
    read = []

    def fetch(start: int, size: int) -> bytes:
        read.append(size)
        return data[start : start + size]

    with pytest.raises(GgufError, match="runs past the first 100,000 bytes"):
        read_metadata(fetch, 100_000)
    assert sum(read) <= 100_000


@pytest.mark.parametrize("keep", [0, 3, 4, 8, 23, 24, 60, 200])
def test_a_truncated_file_is_a_clear_error(keep: int) -> None:
    data = gguf_bytes(TEMPLATE)
    with pytest.raises(GgufError, match="truncated: the file ends at byte"):
        read_bytes(data[:keep])


def test_every_cut_inside_the_header_is_truncated_never_a_crash() -> None:
    data = gguf_bytes(TEMPLATE)
    end = read_bytes(data).header_bytes
    for keep in range(0, end):
        with pytest.raises(GgufError, match="truncated|not a GGUF"):
            read_bytes(data[:keep])


def _header(version: int = 3, kv: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, 0, kv)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GGML" + b"\0" * 40, "not a GGUF file"),
        (_header(version=1), "unsupported GGUF version 1"),
        (_header(kv=10**9), "1,000,000,000 metadata keys"),
        (_header() + _key("x") + struct.pack("<I", 42), "unknown value type 42"),
        (_header() + _key("x") + struct.pack("<IQ", 8, 2**40), "string"),
        (_header() + _key("x") + struct.pack("<IIQ", 9, 4, 2**40), "array of"),
        (
            _header() + _key("x") + struct.pack("<IIQIQIQ", 9, 9, 1, 9, 1, 9, 1),
            "nested too deep",
        ),
    ],
)
def test_malformed_headers_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(GgufError, match=message):
        read_bytes(data + b"\0" * 64, max_bytes=1024 * 1024)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 3))
def test_hostile_bytes_raise_only_gguf_errors(tail: bytes, kv: int) -> None:
    # Anything else (IndexError, UnicodeError, struct.error, …) fails the test.
    with contextlib.suppress(GgufError):
        read_bytes(_header(kv=kv) + tail)


def vocabulary_bomb(tokens: int) -> bytes:
    """A header of `tokens` two-letter tokens, then the special token ids and a template: the
    whole of it under the 32 MiB cap at 3.3 million tokens."""
    key = TOKENS_KEY.encode()
    parts = [struct.pack("<IIQQ", 0x46554747, 3, 0, 4)]
    parts.append(struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, tokens))
    two = struct.pack("<Q", 2)
    parts += [two + bytes([97 + i % 26, 97 + (i // 26) % 26]) for i in range(tokens)]
    for name, value in ((b"tokenizer.ggml.bos_token_id", 1), (b"tokenizer.ggml.eos_token_id", 27)):
        parts.append(struct.pack("<Q", len(name)) + name + struct.pack("<II", 4, value))
    body, key = TEMPLATE.encode(), b"tokenizer.chat_template"
    parts.append(struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(body)) + body)
    return b"".join(parts)


def test_the_vocabulary_is_walked_not_kept() -> None:
    """Every token was decoded and kept, for the two or three special ones: a header of 3.3
    million tokens under the cap took 300 MiB to read, and a repo of four of them 640."""
    import tracemalloc

    data = vocabulary_bomb(1_000_000)
    tracemalloc.start()
    try:
        meta = read_bytes(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert meta.values[TOKENS_KEY] == 1_000_000 and meta.chat_template == TEMPLATE
    assert meta.special_tokens == {"bos_token": "ba", "eos_token": "bb"}
    assert peak < 2 * len(data)  # the bytes read, and nothing a token at a time


def test_a_key_given_twice_is_malformed_as_gguf_and_llama_cpp_have_it() -> None:
    """The template key twice: ours read the last, gguf-py's reader refuses the file."""
    data = gguf_bytes(TEMPLATE, extra={"tokenizer.chat_templatX": "{{ other }}"})
    data = data.replace(b"tokenizer.chat_templatX", b"tokenizer.chat_template")
    with tempfile.NamedTemporaryFile(suffix=".gguf") as handle:
        handle.write(data)
        handle.flush()
        with pytest.raises(KeyError, match="Duplicate"):
            GGUFReader(handle.name)
    with pytest.raises(GgufError, match="'tokenizer.chat_template' appears twice"):
        read_bytes(data)
