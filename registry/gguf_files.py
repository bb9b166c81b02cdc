"""A GGUF repo's embedded chat templates: what llama.cpp renders with by default.

The Hub parses the repo's main GGUF file and answers its template and tokens in
`model_info(expand=["gguf"])`; that template is the repo's, and its verdict the repo's verdict.
Other quantizations of the same repo can embed other templates (converted at another time), so
every GGUF file's header is read too, by HTTP range requests of its first bytes, never the
weights (registry.gguf_header), and each distinct template is kept and listed.

A file is read again only when its content id changes, so a sync of an unchanged repo reads no
header. The bytes read per file and the files read per repo are bounded by settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from .gguf_header import GgufError, GgufMetadata, read_metadata
from .hub import FileInfo, HubClient, RepoInfo
from .models import TemplateVersion
from .repo_files import FoundTemplates, sha256_text, unstorable

SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
#: An architecture name as llama.cpp spells them ("qwen3", "gpt-oss", "rwkv6qwen2").
ARCHITECTURE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")
#: What an entry of HubModel.gguf_files says of its file.
OK, NO_TEMPLATE, BROKEN, NOT_READ = "ok", "no_template", "broken", "not_read"

#: llama.cpp architecture names of models with recurrent / state-space layers (their cache
#: cannot be trimmed), and of models with sliding-window or chunked attention layers.
GGUF_RECURRENT = frozenset(
    {
        "arwkv7",
        "falcon-h1",
        "granitehybrid",
        "jamba",
        "lfm2",
        "lfm2moe",
        "mamba",
        "mamba2",
        "nemotron_h",
        "plamo2",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "rwkv6",
        "rwkv6qwen2",
        "rwkv7",
    }
)
GGUF_SLIDING = frozenset({"cohere2", "gemma2", "gemma3", "gemma3n", "gpt-oss", "llama4"})


def gguf_paths(files: dict[str, FileInfo]) -> list[str]:
    """The GGUF files that carry metadata worth reading: not vision projectors (mmproj), and of
    a split model only the first shard (the others repeat nothing a template needs)."""
    found = []
    for path in sorted(files):
        name = path.rsplit("/", 1)[-1].lower()
        if not name.endswith(".gguf") or name.startswith("mmproj") or "mmproj" in name:
            continue
        shard = SHARD_RE.search(name)
        if shard is not None and int(shard.group(1)) != 1:
            continue
        found.append(path)
    return found


@dataclass
class EmbeddedTemplates:
    """What the GGUF files of a repo's head embed."""

    #: The repo's template (None: no file embeds one); its verdict is the repo's.
    found: FoundTemplates | None
    #: One entry per GGUF file, for HubModel.gguf_files.
    files: list[dict[str, Any]]
    #: Every distinct template text read this time, by SHA-256 (kept as TemplateVersions).
    texts: dict[str, str] = field(default_factory=dict)
    architecture: str = ""
    #: Why no template could be read, when every file failed.
    broken: str = ""
    #: No file changed since the entries in `previous`: nothing was read.
    unchanged: bool = False
    bytes_read: int = 0


def _entry(path: str, info: FileInfo | None, status: str, **values: Any) -> dict[str, Any]:
    return {
        "path": path,
        "id": info.content_id if info else "",
        "size": info.size if info else None,
        "status": status,
        "template": "",
        "named": {},
        "tokens": {},
        "architecture": "",
        "reason": "",
        "bytes": 0,
    } | values


def _read_entry(
    client: HubClient, repo_id: str, revision: str, info: FileInfo, max_bytes: int
) -> tuple[dict[str, Any], GgufMetadata | None]:
    def fetch(start: int, size: int) -> bytes:
        return client.read_range(repo_id, revision, info.path, start, size)

    before = client.bytes_read
    try:
        meta = read_metadata(fetch, max_bytes)
    except GgufError as err:
        entry = _entry(info.path, info, BROKEN, reason=str(err)[:500])
        entry["bytes"] = client.bytes_read - before
        return entry, None
    template = meta.chat_template
    entry = _entry(
        info.path,
        info,
        OK if template.strip() else NO_TEMPLATE,
        template=sha256_text(template) if template.strip() else "",
        named={name: sha256_text(text) for name, text in meta.named_templates.items()},
        tokens=meta.special_tokens,
        architecture=architecture_name(meta.architecture),
        bytes=meta.bytes_read,
    )
    return entry, meta


def read_embedded(
    client: HubClient, info: RepoInfo, previous: list[dict[str, Any]]
) -> EmbeddedTemplates:
    """Read the GGUF files of `info`'s head that changed since `previous` (HubModel.gguf_files);
    raises what the client raises (RepoUnavailable for a gated repo, HubUnavailable)."""
    max_files = int(settings.REGISTRY_GGUF_MAX_FILES)
    max_bytes = int(settings.REGISTRY_GGUF_MAX_HEADER_BYTES)
    known = {
        e["path"]: e
        for e in previous
        if isinstance(e, dict) and e.get("id") and e.get("status") != NOT_READ
    }
    paths = gguf_paths(info.files)
    listed = [e.get("path") for e in previous if isinstance(e, dict)]
    if listed == paths and all(
        p in known and known[p]["id"] == info.files[p].content_id for p in paths[:max_files]
    ):
        if paths:
            # Still ours to read? Model info answers for a repo gated since; its files do not
            # (RepoUnavailable). One byte, and only when the head moved (an unchanged head is
            # not observed at all).
            client.read_range(info.repo_id, info.sha, paths[0], 0, 1)
        return EmbeddedTemplates(None, list(previous), unchanged=True)

    entries: list[dict[str, Any]] = []
    texts: dict[str, str] = {}
    metas: dict[str, GgufMetadata] = {}
    bytes_read = 0
    for number, path in enumerate(paths):
        file = info.files[path]
        if number >= max_files:
            reason = f"not read: only the first {max_files} GGUF files of a repo are read"
            entries.append(_entry(path, file, NOT_READ, reason=reason))
            continue
        old = known.get(path)
        if old is not None and file.content_id and old["id"] == file.content_id:
            entries.append(dict(old))
            continue
        entry, meta = _read_entry(client, info.repo_id, info.sha, file, max_bytes)
        bytes_read += int(entry["bytes"])
        entries.append(entry)
        if meta is not None:
            metas[path] = meta
            for text in (meta.chat_template, *meta.named_templates.values()):
                if text.strip():
                    texts[sha256_text(text)] = text

    summary = client.gguf_summary(info.repo_id)
    found = _repo_template(summary, entries, metas, texts)
    architecture = architecture_name(summary.get("architecture")) or next(
        (e["architecture"] for e in entries if e["architecture"]), ""
    )
    broken = ""
    if found is None and entries and all(e["status"] in (BROKEN, NOT_READ) for e in entries):
        first = next(e for e in entries if e["status"] == BROKEN)
        broken = f"the GGUF header of {first['path']} cannot be read: {first['reason']}"
    tokens = tuple(t for e in entries for t in e.get("tokens", {}).values() if isinstance(t, str))
    if found is not None and (reason := unstorable(found, (*texts.values(), *tokens))):
        # Kept as read but for what the catalog cannot store: each file's tokens and names.
        entries = [{**e, "tokens": {}, "named": {}} for e in entries]
        found, texts, broken = None, {}, reason
    return EmbeddedTemplates(found, entries, texts, architecture, broken, bytes_read=bytes_read)


def _repo_template(
    summary: dict[str, Any],
    entries: list[dict[str, Any]],
    metas: dict[str, GgufMetadata],
    texts: dict[str, str],
) -> FoundTemplates | None:
    """The Hub's template of the main file; without one, the first file that embeds one."""
    hub_text = summary.get("chat_template")
    if isinstance(hub_text, str) and hub_text.strip():
        sha = sha256_text(hub_text)
        texts[sha] = hub_text
        tokens = {k: v for k in ("bos_token", "eos_token") if isinstance(v := summary.get(k), str)}
        twin = next((e for e in entries if e["template"] == sha), None)
        named = _named(twin, metas, hub_text) if twin is not None else {}
        if twin is not None:
            tokens = {**twin["tokens"], **tokens}
        return FoundTemplates("gguf", hub_text, named, tokens)
    for entry in entries:
        if entry["status"] != OK:
            continue
        meta = metas.get(entry["path"])
        text = meta.chat_template if meta is not None else stored_text(entry["template"])
        if text:
            return FoundTemplates("gguf", text, _named(entry, metas, text), dict(entry["tokens"]))
    return None


def _named(entry: dict[str, Any], metas: dict[str, GgufMetadata], default: str) -> dict[str, str]:
    """The named templates of `entry`'s file, with `default`: read now, or, for a file not
    read again (another file of the repo changed), as an earlier sync kept them. Taken from
    this sync's reads alone, they were lost whenever another quantization changed: the repo
    dropped them, and its verdict with them, and recorded a template change that was none."""
    meta = metas.get(entry["path"])
    if meta is not None:
        named = meta.named_templates
    else:
        shas = entry.get("named")
        named = {
            name: text
            for name, sha in (shas.items() if isinstance(shas, dict) else ())
            if isinstance(name, str) and isinstance(sha, str) and (text := stored_text(sha))
        }
    if not named:
        return {}
    return {"default": default, **named}


def architecture_name(value: Any) -> str:
    """`value` if it is an architecture name, else "" (the Hub's summary is any JSON: a lone
    surrogate there made every sync of the repo fail as it was written)."""
    return value if isinstance(value, str) and ARCHITECTURE_RE.fullmatch(value) else ""


def stored_text(sha: str) -> str:
    """A template kept from an earlier sync (a file that did not change is not read again)."""
    return TemplateVersion.objects.filter(sha256=sha).values_list("text", flat=True).first() or ""


def gguf_facts(architecture: str) -> dict[str, Any]:
    """HubModel fields from a GGUF architecture name."""
    name = architecture.lower()
    return {
        "model_type": name[:100],
        "is_hybrid": name in GGUF_RECURRENT,
        "has_sliding_window": name in GGUF_SLIDING,
        "quantization": "gguf",
    }
