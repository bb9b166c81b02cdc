"""Deliveries point at the registry's ModelEvent (the table changed owner, not content)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("alerts", "0001_initial"),
        ("registry", "0004_adopt_domain_tables"),
    ]

    operations = [
        # State only: the database's foreign key already references the renamed table.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="delivery",
                    name="event",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries",
                        to="registry.modelevent",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
