"""Settings for bench_pages.py's gunicorn: the real settings, with URLs that add a trivial view.
Never used by the service itself."""

from __future__ import annotations

from cachesafe.settings import *  # noqa: F403 - the real settings, unchanged but for the URLs

ROOT_URLCONF = "pages_urls"

# bench_pages.py measures with the page cache (as deployed) and without it (every page rendered).
DASHBOARD_PAGE_CACHE_SECONDS = int(env.text("BENCH_PAGE_CACHE_SECONDS", "60"))  # noqa: F405
