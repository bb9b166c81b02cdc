"""The catalog's author filter takes an owner's name in any case, as the Hub does ("qwen" is
Qwen's): `author__iexact`, which compares `upper(author)`, with an index on that expression so a
filter of one author stays an index lookup at 100,000 models."""

from __future__ import annotations

from django.db import migrations, models
from django.db.models.functions import Upper


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0016_reuse_on_the_model"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="hubmodel",
            index=models.Index(Upper("author"), name="hubmodel_author_upper"),
        ),
    ]
