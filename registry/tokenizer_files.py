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
    snapshots = list(
        TemplateSnapshot.objects.filter(tokenizer_json_sha=sha)
        .exclude(source_file=SourceFile.LOCAL)
        .select_related("model")
        .order_by("-created_at")[:TRIED_COMMITS]
    )
    if not snapshots:
        raise TokenizerUnavailable("no Hub repo with this tokenizer.json is tracked")
    size = snapshots[0].tokenizer_json_size or 0
    if size > settings.REGISTRY_MAX_TOKENIZER_BYTES:
        raise TokenizerUnavailable(f"tokenizer.json is {size:,} bytes, over the cap")
    data = _download(snapshots, client or HubClient())
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


#: The newest commits known to hold a tokenizer.json that are asked for it, one after another
#: while the Hub answers 404 (a history rewritten since, a repo renamed).
TRIED_COMMITS = 3


def _download(snapshots: list[TemplateSnapshot], client: HubClient) -> bytes:
    """The tokenizer.json of the first of `snapshots` whose commit the Hub still has; when it
    answers 404 for each, TokenizerUnavailable: not a failure to retry, or the check waiting
    for it would be sent again for ever."""
    for snapshot in snapshots:
        try:
            return client.download(
                snapshot.model.repo_id,
                snapshot.commit_sha,
                "tokenizer.json",
                settings.REGISTRY_MAX_TOKENIZER_BYTES,
            )
        except (RepoUnavailable, BrokenRepo) as exc:
            raise TokenizerUnavailable(f"tokenizer.json could not be read: {exc}") from exc
        except HubUnavailable as exc:
            if exc.status not in (404, 410):
                raise
            logger.info("%s: not found; trying an older record of the same file", exc)
    raise TokenizerUnavailable(
        f"tokenizer.json is gone from the Hub at the {len(snapshots)} newest commit(s) known to"
        " hold it (404)"
    )


__all__ = ["HubUnavailable", "TokenizerUnavailable", "tokenizer_text"]
