"""A GGUF file's metadata, read from the start of the file in growing ranges, never its weights.

llama.cpp renders with the chat template embedded in the GGUF file (`tokenizer.chat_template`),
not the one in the repo's tokenizer_config.json, so that is the template a GGUF repo's verdict is
about. The metadata sits at the start of the file: the magic, the version, the tensor and
key-value counts, then the key-value pairs. The vocabulary (`tokenizer.ggml.tokens`, merges)
usually comes before the template, so reading it costs a few MB for a real model; the bytes
read are bounded by the caller's cap.

Why a reader of our own: `gguf.GGUFReader` memory-maps a complete local file and also parses
the tensor table; here the file is remote, only a bounded prefix is fetched, and a truncated
header has to be told from a malformed one. The value types and the magic come from the `gguf`
package, and the tests compare this reader with `GGUFReader` on files written by `GGUFWriter`.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gguf import GGUFValueType

#: (offset, length) -> the bytes there; fewer at the end of the file, none past it.
Fetch = Callable[[int, int], bytes]

FIRST_CHUNK = 256 * 1024
MAX_CHUNK = 8 * 1024 * 1024
MAX_KEYS = 100_000
MAX_NESTING = 2
TOKENS_KEY = "tokenizer.ggml.tokens"
TEMPLATE_KEY = "tokenizer.chat_template"
#: The special tokens a chat template can name, by the GGUF key of their id.
TOKEN_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


@functools.cache
def _gguf() -> tuple[type[GGUFValueType], int, dict[GGUFValueType, struct.Struct]]:
    """gguf's value types and magic, imported on first use: the package imports numpy and its
    whole writer (about 14 MiB), which web processes, which never read a header, should not
    carry."""
    from gguf import GGUF_MAGIC, GGUFValueType

    kinds = GGUFValueType
    scalars = {
        kinds.UINT8: struct.Struct("<B"),
        kinds.INT8: struct.Struct("<b"),
        kinds.UINT16: struct.Struct("<H"),
        kinds.INT16: struct.Struct("<h"),
        kinds.UINT32: struct.Struct("<I"),
        kinds.INT32: struct.Struct("<i"),
        kinds.FLOAT32: struct.Struct("<f"),
        kinds.BOOL: struct.Struct("<?"),
        kinds.UINT64: struct.Struct("<Q"),
        kinds.INT64: struct.Struct("<q"),
        kinds.FLOAT64: struct.Struct("<d"),
    }
    return kinds, int(GGUF_MAGIC), scalars


_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

Value = str | int | float | bool


class GgufError(Exception):
    """The header cannot be read: malformed, truncated, or longer than the cap."""


@dataclass(frozen=True)
class GgufMetadata:
    version: int
    tensor_count: int
    #: Scalars and strings by key; an array is kept as its length (the tokens apart).
    values: dict[str, Value]
    #: Where the key-value section ends, and how many bytes were fetched to get there.
    header_bytes: int
    bytes_read: int
    #: The special tokens' texts (`bos_token`, ...), looked up in the vocabulary by their ids.
    #: Only those are kept: the vocabulary itself (3 million tokens fit under the cap) is not.
    special_tokens: dict[str, str] = field(default_factory=dict)

    def text(self, key: str) -> str:
        value = self.values.get(key)
        return value if isinstance(value, str) else ""

    @property
    def architecture(self) -> str:
        return self.text("general.architecture")

    @property
    def chat_template(self) -> str:
        return self.text(TEMPLATE_KEY)

    @property
    def named_templates(self) -> dict[str, str]:
        """`tokenizer.chat_template.<name>` (llama.cpp's named templates, e.g. tool_use)."""
        prefix = TEMPLATE_KEY + "."
        return {
            key.removeprefix(prefix): value
            for key, value in sorted(self.values.items())
            if key.startswith(prefix) and isinstance(value, str) and value.strip()
        }


class _Cursor:
    """Bytes of the file from offset 0, fetched as the parse needs them, up to `max_bytes`."""

    def __init__(self, fetch: Fetch, max_bytes: int) -> None:
        self.fetch = fetch
        self.max_bytes = max_bytes
        self.buffer = bytearray()
        self.pos = 0
        self.chunk = FIRST_CHUNK
        self.at_end = False
        self.where = "the header"

    def need(self, size: int) -> None:
        while len(self.buffer) < self.pos + size:
            if self.at_end:
                raise GgufError(
                    f"truncated: the file ends at byte {len(self.buffer):,}, inside {self.where}"
                )
            room = self.max_bytes - len(self.buffer)
            if room <= 0:
                raise self.over_cap(f"at {self.where}")
            ask = min(room, max(self.chunk, self.pos + size - len(self.buffer)))
            data = self.fetch(len(self.buffer), ask)
            self.buffer += data[:ask]
            self.at_end = len(data) < ask
            self.chunk = min(MAX_CHUNK, self.chunk * 2)

    def over_cap(self, what: str) -> GgufError:
        return GgufError(
            f"the metadata runs past the first {self.max_bytes:,} bytes ({what}); not read further"
        )

    def take(self, size: int) -> memoryview:
        self.need(size)
        view = memoryview(self.buffer)[self.pos : self.pos + size]
        self.pos += size
        return view

    def unpack(self, shape: struct.Struct) -> Value:
        value: Value = shape.unpack(self.take(shape.size))[0]
        return value

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def string(self) -> str:
        return bytes(self.take(self._string_size())).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.take(self._string_size())

    def _string_size(self) -> int:
        size = self.u64()
        if size > self.max_bytes:
            raise self.over_cap(f"a {size:,}-byte string at {self.where}")
        return size


def _value_type(raw: int, where: str) -> GGUFValueType:
    try:
        return _gguf()[0](raw)
    except ValueError:
        raise GgufError(f"malformed: unknown value type {raw} at {where}") from None


def _skip_or_read(cursor: _Cursor, kind: GGUFValueType, depth: int = 0) -> Value:
    """One value; an array comes back as its length, its items skipped (strings undecoded)."""
    kinds, _, scalars = _gguf()
    if kind == kinds.STRING:
        if depth:
            cursor.skip_string()
            return ""
        return cursor.string()
    if kind != kinds.ARRAY:
        return cursor.unpack(scalars[kind])
    if depth >= MAX_NESTING:
        raise GgufError(f"malformed: arrays nested too deep at {cursor.where}")
    item = _value_type(int(cursor.unpack(_U32)), cursor.where)
    count = cursor.u64()
    nested = item in (kinds.STRING, kinds.ARRAY)
    smallest = 8 if nested else scalars[item].size
    if count * smallest > cursor.max_bytes:
        raise cursor.over_cap(f"an array of {count:,} items at {cursor.where}")
    if nested:
        for _ in range(count):
            _skip_or_read(cursor, item, depth + 1)
    else:
        cursor.take(count * smallest)
    return count


def read_metadata(fetch: Fetch, max_bytes: int) -> GgufMetadata:
    """Parse the key-value section of the GGUF file behind `fetch`; raises GgufError."""
    cursor = _Cursor(fetch, max_bytes)
    magic = int(cursor.unpack(_U32))
    if magic != _gguf()[1]:
        raise GgufError("malformed: not a GGUF file (its first bytes are not GGUF)")
    version = int(cursor.unpack(_U32))
    if version not in (2, 3):
        raise GgufError(f"unsupported GGUF version {version} (2 and 3 are read)")
    tensor_count = cursor.u64()
    kv_count = cursor.u64()
    if kv_count > MAX_KEYS:
        raise GgufError(f"malformed: {kv_count:,} metadata keys")
    values: dict[str, Value] = {}
    tokens_at = -1
    for number in range(kv_count):
        cursor.where = f"metadata key {number + 1} of {kv_count}"
        key = cursor.string()
        if key in values:
            # gguf-py and llama.cpp refuse such a file: no template of it is anyone's.
            raise GgufError(f"malformed: the key {key[:100]!r} appears twice")
        cursor.where = f"the value of {key[:100]!r}"
        kind = _value_type(int(cursor.unpack(_U32)), cursor.where)
        if key == TOKENS_KEY:
            tokens_at = cursor.pos
        values[key] = _skip_or_read(cursor, kind)
    return GgufMetadata(
        version=version,
        tensor_count=tensor_count,
        values=values,
        header_bytes=cursor.pos,
        bytes_read=len(cursor.buffer),
        special_tokens=_special_tokens(cursor.buffer, tokens_at, values),
    )


def _special_tokens(buffer: bytearray, tokens_at: int, values: dict[str, Value]) -> dict[str, str]:
    """The special tokens' texts, by their ids, from the vocabulary array at `tokens_at` in
    `buffer` (already read whole and checked by the parse): one walk to the largest id,
    decoding only theirs. Decoding and keeping the whole vocabulary took 640 MiB and 22 s for
    four files of 3.3 million tokens each, every one under the cap."""
    wanted = {
        index: name
        for name, key in TOKEN_IDS.items()
        if type(index := values.get(key)) is int and index >= 0
    }
    count = values.get(TOKENS_KEY)
    if tokens_at < 0 or not wanted or type(count) is not int:
        return {}
    kinds = _gguf()[0]
    if _U32.unpack_from(buffer, tokens_at)[0] != kinds.STRING:
        return {}
    found: dict[str, str] = {}
    last = min(max(wanted), count - 1)
    position = tokens_at + 4 + 8
    for index in range(last + 1):
        size = _U64.unpack_from(buffer, position)[0]
        position += 8
        if index in wanted:
            found[wanted[index]] = bytes(buffer[position : position + size]).decode(
                "utf-8", errors="replace"
            )
        position += size
    return {name: found[name] for name in TOKEN_IDS if name in found}


def read_bytes(data: bytes, max_bytes: int | None = None) -> GgufMetadata:
    """The metadata of a GGUF file held in memory (or its first bytes)."""
    # One byte of room past the data, so that running out of it reads as truncation.
    cap = max_bytes or len(data) + 1
    return read_metadata(lambda start, size: data[start : start + size], cap)
