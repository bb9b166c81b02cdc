"""The JSON shapes of registry rows (documented in docs/registry.md).

The HTTP views that serve them (`GET /api/models/<org>/<name>`, `POST /api/models`,
`POST /hooks/hub`) are in dashboard/api.py, the one module of the JSON API.
"""

from __future__ import annotations

from typing import Any

from checks.sources import has_default

from .models import HubModel, TemplateChange, TemplateSnapshot


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def template_json(snapshot: TemplateSnapshot | None) -> dict[str, Any] | None:
    if snapshot is None:
        return None
    named = {n.name: n.version.sha256 for n in snapshot.named_templates.all()}
    return {
        # None for named templates with no `default`: the one filed as such only stands in.
        "sha256": snapshot.default_template.sha256 if has_default(named) else None,
        "source_file": snapshot.source_file,
        "commit": snapshot.commit_sha,
        "named_templates": named,
        "special_tokens": snapshot.special_tokens,
        "tokenizer_json": {"sha": snapshot.tokenizer_json_sha, "size": snapshot.tokenizer_json_size}
        if snapshot.tokenizer_json_sha
        else None,
    }


def change_json(change: TemplateChange) -> dict[str, Any]:
    return {
        "commit": change.commit_sha,
        "date": _iso(change.committed_at),
        "title": change.title,
        "template_sha256": change.new_version.sha256 if change.new_version else None,
        "previous_sha256": change.old_version.sha256 if change.old_version else None,
    }


def model_json(model: HubModel) -> dict[str, Any]:
    """The stable JSON shape of a model (docs/registry.md)."""
    snapshot = None
    if model.current_snapshot_id:
        snapshot = (
            TemplateSnapshot.objects.select_related("default_template")
            .prefetch_related("named_templates__version")
            .get(pk=model.current_snapshot_id)
        )
    changes = model.changes.select_related("new_version", "old_version").order_by(
        "-committed_at", "-id"
    )
    return {
        "repo_id": model.repo_id,
        "author": model.author,
        "status": model.status,
        "status_reason": model.status_reason,
        "sync_error": model.sync_error,
        "sync_failed_at": model.sync_failed_at.isoformat() if model.sync_failed_at else None,
        "verdict": model.verdict,
        "verdict_summary": model.verdict_summary,
        "downloads": model.downloads,
        "likes": model.likes,
        "tags": model.tags,
        "pipeline_tag": model.pipeline_tag,
        "library_name": model.library_name,
        "model_type": model.model_type,
        "architectures": model.architectures,
        "is_hybrid": model.is_hybrid,
        "has_sliding_window": model.has_sliding_window,
        "quantization": model.quantization,
        "base_model": model.base_model,
        "format": model.format,
        "drift": model.drift,
        "last_commit_sha": model.last_commit_sha or None,
        "last_commit_at": _iso(model.last_commit_at),
        "template": template_json(snapshot),
        "history": [change_json(c) for c in changes],
        "history_complete": model.history_complete,
        "history_pending": bool(model.history_from),
    }
