"""One trigram index for the catalog search, on the generated `search_text` column (registry
0009: repo id, family, model type and tags, lower-cased), in place of the four of 0002.

The search asks `search_text LIKE '%term%'` for each term: one index answers every term, the
planner ANDs them in one bitmap, and no `UPPER()` per row. `fastupdate = off`: rows go into
the index as they are written, not into a pending list that each search would scan (and that
makes the planner price the index out until a vacuum). Other databases (SQLite for
`make run`) keep scanning: a no-op there.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, migrations, transaction
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

logger = logging.getLogger(__name__)
OLD_COLUMNS = ("repo_id", "family", "tags", "model_type")
INDEX = "dashboard_search_text_trgm"


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for column in OLD_COLUMNS:
        schema_editor.execute(f"DROP INDEX IF EXISTS dashboard_search_{column}")
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except DatabaseError:
        logger.warning("pg_trgm is not available: catalog search runs without trigram indexes")
        return
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON registry_hubmodel "
        "USING gin (search_text gin_trgm_ops) WITH (fastupdate = off)"
    )


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0004_hand_over_catalog_verdict"),
        ("registry", "0009_search_text"),
    ]
    operations = [migrations.RunPython(create, drop)]
