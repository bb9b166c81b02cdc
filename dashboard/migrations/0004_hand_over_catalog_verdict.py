"""CatalogVerdict now belongs to the registry, which owns every copy of a model's verdict
(registry 0004 adopted and renamed its table). State only: no table is dropped."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0003_probe_verdicts"),
        ("registry", "0004_adopt_domain_tables"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="CatalogVerdict")],
            database_operations=[],
        ),
    ]
