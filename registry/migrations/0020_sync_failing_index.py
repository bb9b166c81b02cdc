"""An index of the models whose last sync failed, and of them alone (a partial index): the
pages' Hub banner asks whether any of them could not connect (`registry.sync_status.
hub_unreachable`), every 30 s in each web process. Without it PostgreSQL read the whole table
for that, 110 to 135 ms at 100,000 models with none failing (docs/dashboard.md, "The Hub
banner's question"). A sync that succeeds writes no `sync_error`, so the index stays as small
as the failures, and a routine sync's update of a row can stay a heap-only one."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0019_covering_order_indexes"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="hubmodel",
            index=models.Index(
                condition=~models.Q(sync_error=""),
                fields=["sync_error"],
                name="hubmodel_sync_failing",
            ),
        ),
    ]
