"""tokenizer.json for token-level checks: fetched from the Hub once per distinct file, kept in
Postgres so every worker (and the next engine version) reuses it."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import IntegrityError, transaction

from .hub import HubClient, HubUnavailable, RepoUnavailable
from .models import SourceFile, TemplateSnapshot, TokenizerFile
from .repo_files import BrokenRepo

logger = logging.getLogger(__name__)


class TokenizerUnavailable(Exception):
    """This tokenizer cannot be had (gone, gated, too big, imported locally): check bytes only."""


def tokenizer_text(sha: str, client: HubClient | None = None) -> str:
    """The text of the tokenizer.json the registry knows by `sha`.

    Raises TokenizerUnavailable when it cannot be had for good, HubUnavailable when the Hub did
    not answer this time (the caller retries later).
    """
    stored = TokenizerFile.objects.filter(sha=sha).values_list("text", flat=True).first()
    if stored is not None:
        return stored
    snapshot = (
        TemplateSnapshot.objects.filter(tokenizer_json_sha=sha)
        .exclude(source_file=SourceFile.LOCAL)
        .select_related("model")
        .order_by("-created_at")
        .first()
    )
    if snapshot is None:
        raise TokenizerUnavailable("no Hub repo with this tokenizer.json is tracked")
    size = snapshot.tokenizer_json_size or 0
    if size > settings.REGISTRY_MAX_TOKENIZER_BYTES:
        raise TokenizerUnavailable(f"tokenizer.json is {size:,} bytes, over the cap")
    client = client or HubClient()
    try:
        data = client.download(
            snapshot.model.repo_id,
            snapshot.commit_sha,
            "tokenizer.json",
            settings.REGISTRY_MAX_TOKENIZER_BYTES,
        )
    except (RepoUnavailable, BrokenRepo) as exc:
        raise TokenizerUnavailable(f"tokenizer.json could not be read: {exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerUnavailable("tokenizer.json is not valid UTF-8") from exc
    try:
        with transaction.atomic():
            TokenizerFile.objects.create(sha=sha, size=len(data), text=text)
    except IntegrityError:
        pass  # another worker stored the same file meanwhile
    return text


__all__ = ["HubUnavailable", "TokenizerUnavailable", "tokenizer_text"]
