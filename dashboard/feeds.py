"""Atom feeds of template changes: all models, one author, one model."""

from __future__ import annotations

import re
from datetime import datetime
from urllib.parse import urlencode

from django.contrib.syndication.views import Feed
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.urls import reverse
from django.utils.feedgenerator import Atom1Feed

from registry.models import HubModel, TemplateChange
from registry.models.catalog import DATED

FEED_SIZE = 50

#: What XML 1.0 cannot hold (its `Char` production): most control characters, lone surrogates,
#: U+FFFE and U+FFFF. Django's feed writer refuses them with an exception.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """`text` without the characters XML cannot hold. A commit title is the Hub's, any text:
    one with an escape code or a form feed made every feed that listed it answer 500."""
    return _NOT_XML.sub("", text)


class _ChangeFeed(Feed):  # type: ignore[type-arg]
    feed_type = Atom1Feed

    def _changes(self) -> QuerySet[TemplateChange]:
        """Newest first by `TemplateChange.dated`: the commit's date, but never later than when
        the change was found (a commit dated 2099 stayed on top of every feed)."""
        return (
            TemplateChange.objects.select_related("model", "old_version", "new_version")
            .defer("old_version__text", "new_version__text")
            .annotate(dated_at=DATED)
            .order_by("-dated_at", "-id")
        )

    def item_title(self, item: TemplateChange) -> str:
        # Syndication escapes titles itself; repo ids and commit titles come from the Hub.
        title = f" ({xml_text(item.title)})" if item.title else ""
        # A first version is a template added, not changed (nothing before it to diff).
        what = "chat template changed" if item.old_version_id else "chat template added"
        return f"{item.model.repo_id}: {what}{title}"

    def item_description(self, item: TemplateChange) -> str:
        verdict = item.model.get_verdict_display()
        what = "changed" if item.old_version_id else "added"
        return (
            f"Commit {item.commit_sha[:12]} {what} the chat template of {item.model.repo_id}. "
            f"Current verdict: {verdict}."
        )

    def item_link(self, item: TemplateChange) -> str:
        org, name = item.model.repo_id.split("/", 1)
        if item.new_version is not None and item.old_version is not None:
            args = [item.new_version.sha256, item.old_version.sha256]
            url = reverse("dashboard:version_diff", args=args)
            return f"{url}?{urlencode({'model': item.model.repo_id})}"
        return reverse("dashboard:model", args=[org, name])

    def item_guid(self, item: TemplateChange) -> str:
        return f"cachesafe-change-{item.model.repo_id}-{item.commit_sha}"

    def item_updateddate(self, item: TemplateChange) -> datetime:
        return item.dated

    def item_pubdate(self, item: TemplateChange) -> datetime:
        return item.dated


class AllChanges(_ChangeFeed):
    title = "CacheSafe: chat template changes"
    subtitle = "Every chat template change of every tracked model, with its cache verdict."

    def link(self) -> str:
        return reverse("dashboard:catalog")

    def items(self) -> QuerySet[TemplateChange]:
        return self._changes()[:FEED_SIZE]


class AuthorChanges(_ChangeFeed):
    def get_object(self, request: HttpRequest, author: str) -> str:
        """The author as the catalog spells them, from their name in any case (the catalog's
        filter takes it so, and links here with the name as typed)."""
        found = (
            HubModel.objects.filter(author__iexact=author).values_list("author", flat=True).first()
        )
        if found is None:
            raise Http404("no tracked model of this author")
        return found

    def title(self, obj: str) -> str:
        return f"CacheSafe: chat template changes by {obj}"

    def link(self, obj: str) -> str:
        return reverse("dashboard:catalog") + "?" + urlencode({"author": obj})

    def items(self, obj: str) -> QuerySet[TemplateChange]:
        return self._changes().filter(model__author=obj)[:FEED_SIZE]


class ModelChanges(_ChangeFeed):
    def get_object(self, request: HttpRequest, org: str, name: str) -> HubModel:
        model = HubModel.objects.named(f"{org}/{name}")
        if model is None:
            raise Http404("model not tracked")
        return model

    def title(self, obj: HubModel) -> str:
        return f"CacheSafe: chat template changes of {obj.repo_id}"

    def link(self, obj: HubModel) -> str:
        org, name = obj.repo_id.split("/", 1)
        return reverse("dashboard:model", args=[org, name])

    def items(self, obj: HubModel) -> QuerySet[TemplateChange]:
        return self._changes().filter(model=obj)[:FEED_SIZE]
