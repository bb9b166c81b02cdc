"""When the Hub first answered a repo's model info with a bare 404 (no `RepoNotFound`): such a
404 marks the repo missing only once it has lasted `registry.sync.MISSING_AFTER`."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0021_one_model_per_repo_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="hubmodel",
            name="not_found_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
