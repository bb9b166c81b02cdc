"""One index for each of the catalog's four orders (dashboard.catalog, `SORTED_READ`), in that
order. On PostgreSQL each also holds what a search tests (`search_text`, and the two columns
that keep a repo the Hub never had out of the catalog) and the key: a search alone walks it
without reading the table (an index-only scan) and reads its page's rows by key afterwards.
Walking through the table cost about 2 µs a model at 100,000 models, the index alone about
0.7 (docs/dashboard.md, "A search walks its order's index alone").

They replace the indexes each order had: the plain one on downloads (the field's own), the
prompt reuse and last template change orders' (migrations 0016 and 0015, built again under
their names) and the one on upper(repo_id) (0014), whose lookups (`repo_id__iexact`) the name
order's index serves, its key starting the same. With a plain index beside each, PostgreSQL
walked the smaller one through the table wherever it could not count on the index alone (a
table not yet vacuumed). Each holds a copy of every model's `search_text`: about 41 MB an index
at 100,000 models, built in under a second each. SQLite (`make run`) has no included columns
and no `NULLS LAST` in an index: it gets the downloads and name orders' keys alone.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

INCLUDED = "id, search_text, status, current_snapshot_id"
#: Each order's index: its name and its key, as the catalog sorts.
ORDERS = {
    "hubmodel_downloads_order": "downloads DESC, repo_id",
    "hubmodel_reuse_order": "reuse DESC NULLS LAST, repo_id",
    "hubmodel_changed_order": "last_template_change_at DESC NULLS LAST, repo_id",
    "hubmodel_name_order": "upper(repo_id), repo_id",
}
#: SQLite's: the orders it can index.
SQLITE_ORDERS = ("hubmodel_downloads_order", "hubmodel_name_order")
#: The two built again here, as migrations 0015 and 0016 made them (PostgreSQL only).
EARLIER = ("hubmodel_reuse_order", "hubmodel_changed_order")


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for name, key in ORDERS.items():
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")
            schema_editor.execute(
                f"CREATE INDEX {name} ON registry_hubmodel ({key}) INCLUDE ({INCLUDED})"
            )
        # Statistics for upper(repo_id) at once, as migration 0014 did for its index: without
        # them PostgreSQL guessed 500 matches of 100,000 for a repo id in any case.
        schema_editor.execute("ANALYZE registry_hubmodel")
    elif schema_editor.connection.vendor == "sqlite":
        for name in SQLITE_ORDERS:
            schema_editor.execute(f"CREATE INDEX {name} ON registry_hubmodel ({ORDERS[name]})")


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    for name in ORDERS if vendor == "postgresql" else SQLITE_ORDERS:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")
    if vendor == "postgresql":
        for name in EARLIER:
            schema_editor.execute(f"CREATE INDEX {name} ON registry_hubmodel ({ORDERS[name]})")


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0018_search_separators"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="hubmodel", name="hubmodel_repo_id_upper"),
        migrations.AlterField(
            model_name="hubmodel",
            name="downloads",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(create, drop),
    ]
