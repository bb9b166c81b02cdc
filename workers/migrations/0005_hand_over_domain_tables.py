"""ModelEvent, Lease and ProbeRun now belong to the registry (registry 0004 adopted and renamed
their tables); workers forgets them. State only: no table is dropped."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0004_probe_run"),
        ("registry", "0004_adopt_domain_tables"),
        ("alerts", "0002_event_from_registry"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="ModelEvent"),
                migrations.DeleteModel(name="Lease"),
                migrations.DeleteModel(name="ProbeRun"),
            ],
            database_operations=[],
        ),
    ]
