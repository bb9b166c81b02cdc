"""`search_text` writes the separators inside a repo id or a tag (`-`, `_`, `.`, `/`, `:`) as
letters of their own, so that pg_trgm keeps the trigrams that cross them (registry.models.catalog,
`SEARCH_SEPARATORS`). A generated column's expression cannot be altered: the column is dropped
and added again (the table is rewritten, its trigram index with it), and the index of dashboard
migration 0005 is built again on PostgreSQL. The letters are written here as they were when
this migration was made, not imported.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from django.db.models import Func
from django.db.models.functions import Cast, Concat, Lower, Replace

INDEX = "dashboard_search_text_trgm"
SEPARATORS = {"-": "ƀ", "_": "ƃ", ".": "ƅ", "/": "ƈ", ":": "ƌ"}
ESCAPE = "\ufffd"


def searched() -> Lower:
    return Lower(
        Concat(
            models.F("repo_id"),
            models.Value(" "),
            models.F("family"),
            models.Value(" "),
            models.F("model_type"),
            models.Value(" "),
            Cast(models.F("tags"), models.TextField()),
            output_field=models.TextField(),
        )
    )


def written_as_letters() -> Func:
    text: Func = searched()
    for letter in SEPARATORS.values():
        text = Replace(
            text, models.Value(letter), models.Value(ESCAPE), output_field=models.TextField()
        )
    for separator, letter in SEPARATORS.items():
        text = Replace(
            text, models.Value(separator), models.Value(letter), output_field=models.TextField()
        )
    return text


def index(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """The trigram index on the column as it now is, where dashboard migration 0005 could build
    it (PostgreSQL with pg_trgm; it installed the extension or said why not)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON registry_hubmodel "
        "USING gin (search_text gin_trgm_ops) WITH (fastupdate = off)"
    )
    schema_editor.execute("ANALYZE registry_hubmodel")


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0017_author_in_any_case"),
        ("dashboard", "0006_search_words"),
    ]

    operations = [
        # Undone last: the index again on the column as it was.
        migrations.RunPython(migrations.RunPython.noop, index),
        migrations.RemoveField(model_name="hubmodel", name="search_text"),
        migrations.AddField(
            model_name="hubmodel",
            name="search_text",
            field=models.GeneratedField(
                db_persist=True,
                expression=written_as_letters(),
                output_field=models.TextField(),
            ),
        ),
        migrations.RunPython(index, migrations.RunPython.noop),
    ]
