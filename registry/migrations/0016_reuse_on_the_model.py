"""The catalog's "Prompt reuse" figure moves from the catalog row to the model, and on
PostgreSQL gets an index in the catalog's order (the figure descending, models without one
last, then the repo id). On the catalog row no index could give that order: a broad search
sorted by it joined every match to every catalog row and sorted them all, 40.6 ms for "mistral"
at 100,000 models (docs/dashboard.md, "Sorted by prompt reuse"). SQLite (`make run`) cannot
index `NULLS LAST`, and sorts its small catalogs without it. The figures are copied over, both
ways. The copy writes every checked model's row once, with its entries in the catalog's
indexes: 44 s for 100,000 models on PostgreSQL (2 cores), once.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from django.db.models import OuterRef, Subquery

INDEX = "hubmodel_reuse_order"


def to_model(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    hub_model = apps.get_model("registry", "HubModel")
    catalog_verdict = apps.get_model("registry", "CatalogVerdict")
    figure = catalog_verdict.objects.filter(model_id=OuterRef("pk")).values("reuse")[:1]
    hub_model.objects.filter(catalog_verdict__reuse__isnull=False).update(reuse=Subquery(figure))


def to_catalog_row(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    hub_model = apps.get_model("registry", "HubModel")
    catalog_verdict = apps.get_model("registry", "CatalogVerdict")
    figure = hub_model.objects.filter(pk=OuterRef("model_id")).values("reuse")[:1]
    catalog_verdict.objects.update(reuse=Subquery(figure))


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON registry_hubmodel (reuse DESC NULLS LAST, repo_id)"
    )


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0015_changed_order_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="hubmodel",
            name="reuse",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.RunPython(to_model, to_catalog_row),
        migrations.RemoveField(
            model_name="catalogverdict",
            name="reuse",
        ),
        migrations.RunPython(create, drop),
    ]
