"""The catalog's probe column holds the probe's own verdicts (hit, partial, miss, wrong).

`warm` and `cold` were placeholders from before probes were stored; any row carrying one maps to
the nearest verdict.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

OLD_TO_NEW = {"warm": "hit", "cold": "miss"}


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    CatalogVerdict = apps.get_model("dashboard", "CatalogVerdict")
    for old, new in OLD_TO_NEW.items():
        CatalogVerdict.objects.filter(probe=old).update(probe=new)


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    CatalogVerdict = apps.get_model("dashboard", "CatalogVerdict")
    for old, new in OLD_TO_NEW.items():
        CatalogVerdict.objects.filter(probe=new).update(probe=old)
    CatalogVerdict.objects.filter(probe__in=["partial", "wrong"]).update(probe="cold")


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0002_search_trigram_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="catalogverdict",
            name="probe",
            field=models.CharField(
                choices=[
                    ("none", "No probe yet"),
                    ("hit", "Probe: cache reused"),
                    ("partial", "Probe: partly reused"),
                    ("miss", "Probe: cache lost"),
                    ("wrong", "Probe: wrong output from cache"),
                ],
                db_index=True,
                default="none",
                max_length=16,
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
