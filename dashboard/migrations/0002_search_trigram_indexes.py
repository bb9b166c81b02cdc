"""Trigram indexes for the catalog search on PostgreSQL (icontains over repo id, family, tags,
model type: `UPPER(col::text) LIKE UPPER('%term%')`). Measured on 10,000 models: a count that
scanned the table in 25 ms takes 0.2-2 ms for terms of three characters or more.

Other databases (SQLite for `make run`) keep scanning: a no-op there.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, migrations, transaction
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

logger = logging.getLogger(__name__)
COLUMNS = ("repo_id", "family", "tags", "model_type")


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except DatabaseError:
        # Needs a privileged role; search works without it, only slower.
        logger.warning("pg_trgm is not available: catalog search runs without trigram indexes")
        return
    for column in COLUMNS:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS dashboard_search_{column} ON registry_hubmodel "
            f"USING gin (UPPER({column}::text) gin_trgm_ops)"
        )


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for column in COLUMNS:
        schema_editor.execute(f"DROP INDEX IF EXISTS dashboard_search_{column}")


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
