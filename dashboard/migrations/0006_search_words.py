"""Short search terms (one or two characters) have no trigram, so the trigram index of 0005
cannot serve them and they scanned every row. They match the start of a word instead: a
generated `search_words` column holds the words of the searched fields (repo id, family, model
type, tags; runs of letters and digits, lower-cased) as a tsvector, with a GIN index, and the
search asks `search_words @@ 'term:*'`. PostgreSQL only, like the trigram index: other
databases (SQLite for `make run`) keep scanning.

A generated column cannot read another one, so the expression repeats `search_text`'s.
"""

from __future__ import annotations

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

INDEX = "dashboard_search_words_gin"
WORDS = (
    "to_tsvector('simple'::regconfig, regexp_replace(lower("
    "COALESCE(repo_id, '') || ' ' || COALESCE(family, '') || ' ' || COALESCE(model_type, '') "
    "|| ' ' || COALESCE(tags::text, '')), '[^a-z0-9]+', ' ', 'g'))"
)


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "ALTER TABLE registry_hubmodel ADD COLUMN IF NOT EXISTS search_words tsvector "
        f"GENERATED ALWAYS AS ({WORDS}) STORED"
    )
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON registry_hubmodel "
        "USING gin (search_words) WITH (fastupdate = off)"
    )


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")
    schema_editor.execute("ALTER TABLE registry_hubmodel DROP COLUMN IF EXISTS search_words")


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0005_search_text_index"),
        ("registry", "0013_history_backfill"),
    ]
    operations = [migrations.RunPython(create, drop)]
