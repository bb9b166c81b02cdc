"""A fake Hub shaped like the one people discover: the corpus's base repos, and what the
community makes of them. MLX conversions and GGUF quantizations copy the base's first template
(so where the base changed it later they lag), fine-tunes edit it, a conversion of a fine-tune
sits two levels down, a card names a missing repo, another names itself, and a few repos lack
the `conversational` tag (discovery must skip them)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.gguf_files import gguf_bytes

from .corpus import CorpusTemplate, build_corpus_hub, load_corpus, upload_files
from .store import RepoStore

EDIT = "{#- fine-tuned: same turns, own system prompt -#}\n"


def _trend(repo_id: str) -> int:
    """A trending order unlike the downloads order, stable across runs."""
    return int(hashlib.sha1(repo_id.encode()).hexdigest()[:6], 16) % 10_000


def _gguf(template: bytes, corpus: CorpusTemplate) -> bytes:
    bos, eos = corpus.bos_token or "<s>", corpus.eos_token or "</s>"
    tokens = [bos, eos, "hello", "world"] if bos != eos else [bos, "hello", "world"]
    return gguf_bytes(
        template.decode("utf-8"),
        arch="llama",
        tokens=tokens,
        bos_id=0,
        eos_id=tokens.index(eos),
    )


def build_discovery_hub(store: RepoStore, corpus_dir: Path) -> int:
    """The corpus hub plus derivatives of every base; returns the number of repos."""
    build_corpus_hub(store, corpus_dir, include_unnamed=True)
    groups: dict[str, list[CorpusTemplate]] = {}
    for template in load_corpus(corpus_dir, include_unnamed=True):
        groups.setdefault(template.repo_id, []).append(template)
    for number, repo in enumerate(store.all()):
        repo.trending_score = _trend(repo.repo_id)
        if number % 9 == 4:
            repo.pipeline_tag = "image-text-to-text"
    for number, (base_id, versions) in enumerate(sorted(groups.items())):
        first = versions[0]
        name = base_id.split("/", 1)[1]
        base = store.get(base_id)
        downloads = base.downloads if base else 1000
        derived: list[tuple[str, str, dict[str, bytes | str | None], list[str], str | None]] = []
        mlx = f"mlx-community/{name}-4bit"
        derived.append(
            (
                mlx,
                base_id,
                upload_files(mlx, first.text, first.bos_token, first.eos_token, as_jinja=False),
                ["mlx", "safetensors", "text-generation", "conversational"],
                "mlx",
            )
        )
        quant = f"bartowski/{name}-GGUF"
        files: dict[str, bytes | str | None] = {
            f"{name}-Q4_K_M.gguf": _gguf(first.text, first),
            f"{name}-Q8_0.gguf": _gguf(versions[-1].text, versions[-1]),
            "README.md": f"# {quant}\n",
        }
        if number % 7 == 3:
            whole = _gguf(first.text, first)
            files[f"{name}-IQ2_XS.gguf"] = whole[: len(whole) // 3]  # an upload cut short
        derived.append((quant, base_id, files, ["gguf", "text-generation", "conversational"], None))
        if number % 4 == 0:
            tune = f"finetuner/{name}-sft"
            edited = EDIT.encode() + versions[-1].text
            derived.append(
                (
                    tune,
                    base_id,
                    upload_files(tune, edited, first.bos_token, first.eos_token, as_jinja=True),
                    ["transformers", "safetensors", "text-generation", "conversational"],
                    "transformers",
                )
            )
            two = f"mlx-community/{name}-sft-4bit"
            derived.append(
                (
                    two,
                    tune,
                    upload_files(two, edited, first.bos_token, first.eos_token, as_jinja=False),
                    ["mlx", "safetensors", "text-generation", "conversational"],
                    "mlx",
                )
            )
        if number % 10 == 5:
            raw = f"lab/{name}-pretrain"
            derived.append(
                (
                    raw,
                    "",
                    upload_files(raw, first.text, first.bos_token, first.eos_token, as_jinja=False),
                    ["transformers", "safetensors", "text-generation"],  # not conversational
                    "transformers",
                )
            )
        for rank, (repo_id, parent, upload, tags, library) in enumerate(derived):
            store.create_repo(
                repo_id,
                downloads=max(1, downloads // (3 + rank)),
                tags=tags,
                library_name=library,
                base_model=parent or None,
                trending_score=_trend(repo_id),
            )
            store.add_commit(repo_id, upload, "Upload folder using huggingface_hub")
    # Cards that point nowhere useful: a missing repo, and the repo itself.
    for repo_id, parent in (
        ("orphan/lost-base-4bit", "gone/never-existed"),
        ("self/loop", "self/loop"),
    ):
        store.create_repo(
            repo_id,
            downloads=5,
            tags=["mlx", "text-generation", "conversational"],
            library_name="mlx",
            base_model=parent,
        )
        first = next(iter(groups.values()))[0]
        store.add_commit(
            repo_id,
            upload_files(repo_id, first.text, first.bos_token, first.eos_token, as_jinja=False),
            "Upload",
        )
    return len(store.all())
