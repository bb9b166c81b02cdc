"""Dashboard URLs. Pages pinned to a template version (`/t/<sha256>/…`) or a commit
(`/m/<org>/<name>/at/<commit>/`) never change meaning; `/m/<org>/<name>/…` follows the latest."""

from __future__ import annotations

from django.urls import path, re_path, register_converter
from django.views.decorators.http import require_safe

from . import api, api_errors, discovery, feeds, staff, views


class RepoPartConverter:
    """One half of a Hub repo id (`Qwen`, `Qwen3-30B-A3B-Instruct-2507`, `gpt-oss-20b.v1`,
    `_private-looking`: a name may start with an underscore, as `validate_repo_id` allows)."""

    regex = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class ShaConverter:
    regex = r"[0-9a-f]{64}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class CommitConverter(ShaConverter):
    regex = r"[0-9a-f]{7,40}"


register_converter(RepoPartConverter, "repo")
register_converter(ShaConverter, "sha")
register_converter(CommitConverter, "commit")

app_name = "dashboard"
urlpatterns = [
    path("", views.catalog, name="catalog"),
    path("m/<repo:org>/<repo:name>/", views.model_detail, name="model"),
    path("m/<repo:org>/<repo:name>/at/<commit:commit>/", views.model_detail, name="model_at"),
    path(
        "m/<repo:org>/<repo:name>/pair/<str:variant>/<str:session>/<int:index>/",
        views.model_pair_latest,
        name="model_pair",
    ),
    path(
        "m/<repo:org>/<repo:name>/changes.atom",
        require_safe(feeds.ModelChanges()),
        name="model_feed",
    ),
    path("m/<repo:org>/<repo:name>/resync", staff.resync, name="model_resync"),
    path("m/<repo:org>/<repo:name>/recheck", staff.recheck, name="model_recheck"),
    path("m/<repo:org>/<repo:name>/probe", staff.probe, name="model_probe"),
    path("probes/", views.probe_queue, name="probes"),
    path("discovery/", discovery.discovery_panel, name="discovery"),
    path("discovery/run", discovery.start_discovery, name="discover"),
    path("diagnose/", views.diagnose_page, name="diagnose"),
    path("t/<sha:sha256>/", views.template_detail, name="template"),
    path(
        "t/<sha:sha256>/pair/<str:variant>/<str:session>/<int:index>/",
        views.pair_detail,
        name="pair",
    ),
    path("t/<sha:sha256>/vs/<sha:old_sha256>/", views.version_diff, name="version_diff"),
    path("badge/<repo:org>/<repo:name>.svg", views.badge, name="badge"),
    path("feeds/changes.atom", require_safe(feeds.AllChanges()), name="feed"),
    path(
        "feeds/authors/<repo:author>.atom", require_safe(feeds.AuthorChanges()), name="author_feed"
    ),
    # The JSON API and the Hub webhook (api.py, with the schema generated from it), then a JSON
    # 404 for any other path under them: an API client never gets the site's HTML pages.
    *api.urlpatterns(),
    re_path(r"^(api|hooks)(/|$)", api_errors.unknown_path, name="api_unknown"),
]
