"""Repos for the fake Hub, built from the reference corpus (`../shared/corpus`).

Each corpus template becomes a repo laid out as on the Hub: an initial commit, an upload
commit (config.json, tokenizer.json through LFS, tokenizer_config.json, README.md), a later
template update where the corpus holds two versions of one repo, sometimes a move of the
template to `chat_template.jinja` (same text: not a change), and a README-only commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .store import RepoStore

UNNAMED_ORG = "corpus"


@dataclass(frozen=True)
class CorpusTemplate:
    file: str
    repo_id: str
    text: bytes
    bos_token: str | None
    eos_token: str | None
    family: str


def load_corpus(corpus_dir: Path, *, include_unnamed: bool = False) -> list[CorpusTemplate]:
    """The corpus entries, grouped so that older versions of one repo come first."""
    index = json.loads((corpus_dir / "index.json").read_text(encoding="utf-8"))
    templates = []
    for item in index:
        repo_id = item.get("hf_repo_id")
        if not repo_id:
            if not include_unnamed:
                continue
            repo_id = f"{UNNAMED_ORG}/{Path(item['file']).stem}"
        templates.append(
            CorpusTemplate(
                file=item["file"],
                repo_id=repo_id,
                text=(corpus_dir / "templates" / item["file"]).read_bytes(),
                bos_token=item.get("bos_token"),
                eos_token=item.get("eos_token"),
                family=item.get("family") or "",
            )
        )

    def age(t: CorpusTemplate) -> tuple[str, int]:
        # "-older" files predate their sibling; "-rev2" files come after theirs.
        rank = 0 if "older" in t.file else 2 if "rev2" in t.file else 1
        return (t.repo_id, rank)

    return sorted(templates, key=age)


def config_for(repo_id: str) -> dict[str, Any]:
    """A plausible config.json: the architecture facts the registry reads from it."""
    name = repo_id.lower()
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 4,
    }
    if "qwen3.5" in name or "qwen3-next" in name:
        config.update(
            architectures=["Qwen3_5ForConditionalGeneration"],
            model_type="qwen3_5",
            text_config={
                "model_type": "qwen3_5_text",
                "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            },
        )
    elif "lfm2" in name:
        config.update(
            architectures=["Lfm2ForCausalLM"],
            model_type="lfm2",
            layer_types=["conv", "conv", "full_attention", "conv"],
        )
    elif "granite-4.0-h" in name:
        config.update(
            architectures=["GraniteMoeHybridForCausalLM"],
            model_type="granitemoehybrid",
            layer_types=["mamba", "mamba", "mamba", "attention"],
        )
    elif "nemotron" in name and "nano" in name:
        config.update(
            architectures=["NemotronHForCausalLM"],
            model_type="nemotron_h",
            hybrid_override_pattern="M-M-M*-",
        )
    elif "gemma" in name:
        config.update(
            architectures=["Gemma2ForCausalLM"],
            model_type="gemma2",
            sliding_window=4096,
            layer_types=["sliding_attention", "full_attention"] * 2,
        )
    elif "mistral-7b-instruct-v0.1" in name:
        config.update(
            architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096
        )
    elif "qwen" in name:
        config.update(
            architectures=["Qwen2ForCausalLM"],
            model_type="qwen2",
            sliding_window=32768,
            use_sliding_window=False,
        )
    if "gptq" in name:
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    if name.startswith("mlx-community/"):
        config["quantization"] = {"group_size": 64, "bits": 4}
    return config


def tokenizer_json(repo_id: str) -> bytes:
    return json.dumps({"version": "1.0", "model": {"type": "BPE"}, "repo": repo_id}).encode()


def tokenizer_config(
    template: bytes | None,
    bos: str | None,
    eos: str | None,
    named: dict[str, bytes] | None = None,
) -> bytes:
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 8192,
    }
    if bos is not None:
        config["bos_token"] = bos
    if eos is not None:
        config["eos_token"] = {"__type": "AddedToken", "content": eos, "special": True}
    if named is not None:
        config["chat_template"] = [
            {"name": name, "template": text.decode("utf-8")} for name, text in named.items()
        ]
    elif template is not None:
        config["chat_template"] = template.decode("utf-8")
    return json.dumps(config, ensure_ascii=False, indent=2).encode("utf-8")


def upload_files(
    repo_id: str,
    template: bytes,
    bos: str | None,
    eos: str | None,
    *,
    as_jinja: bool,
) -> dict[str, bytes | str | None]:
    """The files of a model upload, with the template where `as_jinja` says."""
    return {
        "config.json": json.dumps(config_for(repo_id), indent=2).encode(),
        "tokenizer.json": tokenizer_json(repo_id),
        "tokenizer_config.json": tokenizer_config(None if as_jinja else template, bos, eos),
        "chat_template.jinja": template if as_jinja else None,
        "README.md": f"# {repo_id}\n".encode(),
    }


def build_corpus_hub(store: RepoStore, corpus_dir: Path, *, include_unnamed: bool = False) -> int:
    """Add one repo per corpus repo id (several versions become several commits)."""
    groups: dict[str, list[CorpusTemplate]] = {}
    for template in load_corpus(corpus_dir, include_unnamed=include_unnamed):
        groups.setdefault(template.repo_id, []).append(template)
    for number, (repo_id, versions) in enumerate(sorted(groups.items())):
        first = versions[0]
        store.create_repo(
            repo_id,
            downloads=1000 * (len(groups) - number),
            likes=number,
            tags=["transformers", "safetensors", "text-generation", "conversational"],
        )
        as_jinja = number % 3 == 1
        store.add_commit(
            repo_id,
            upload_files(repo_id, first.text, first.bos_token, first.eos_token, as_jinja=as_jinja),
            title="Upload folder using huggingface_hub",
        )
        for later in versions[1:]:
            changed = (
                {"chat_template.jinja": later.text}
                if as_jinja
                else {
                    "tokenizer_config.json": tokenizer_config(
                        later.text, later.bos_token, later.eos_token
                    )
                }
            )
            store.add_commit(repo_id, changed, title="Update chat template")
        if number % 3 == 2:
            last = versions[-1]
            store.add_commit(
                repo_id,
                {
                    "chat_template.jinja": last.text,
                    "tokenizer_config.json": tokenizer_config(None, last.bos_token, last.eos_token),
                },
                title="Move chat template to chat_template.jinja",
            )
        store.add_commit(repo_id, {"README.md": f"# {repo_id}\n\nUsage.\n"}, "Update README.md")
    return len(groups)


def build_scaled_hub(store: RepoStore, corpus_dir: Path, count: int) -> list[str]:
    """`count` repos cycling through the corpus templates (fine-tunes sharing templates)."""
    templates = load_corpus(corpus_dir, include_unnamed=True)
    repo_ids = []
    for number in range(count):
        source = templates[number % len(templates)]
        repo_id = f"bench-org-{number % 20:02d}/{Path(source.file).stem[:60]}-{number:04d}"
        store.create_repo(repo_id, downloads=count - number, tags=["text-generation"])
        store.add_commit(
            repo_id,
            upload_files(
                repo_id, source.text, source.bos_token, source.eos_token, as_jinja=number % 2 == 0
            ),
            title="Upload folder using huggingface_hub",
        )
        store.add_commit(repo_id, {"README.md": "# fine-tune\n"}, title="Update README.md")
        repo_ids.append(repo_id)
    return repo_ids
