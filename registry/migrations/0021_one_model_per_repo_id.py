"""One model per repo id in any letters: a unique index on lower(repo_id).

The Hub's ids are case-insensitive, and `HubModel.objects.track` looks a repo up in any case
before it inserts one. Two requests tracking the same repo in other letters at the same instant
(a reader's form and a webhook, say) could both find nothing and both insert: two rows, each
synced, each with its own subscribers. The index settles that race in the database.

A database that already holds such rows is merged first, into the oldest row of each repo (the
one every case-insensitive lookup found): what people made or measured on the others (their
subscriptions, probe runs and events, with the alerts delivered for them) moves to it, and the
others go with what the Hub gives again on the next sync (snapshots, changes, catalog row). A
subscription its owner already had on the oldest row, on the same channel, is folded into it:
it hears about everything either of the two asked for.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from django.db.models import Count
from django.db.models.functions import Lower

#: What a subscription asks to hear about; a folded one keeps each the other asked for.
SUBSCRIPTION_FLAGS = (
    "on_template",
    "on_verdict",
    "on_probe",
    "on_status",
    "on_base_fixed",
    "with_derivatives",
)


def merge_spellings(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    hub_model = apps.get_model("registry", "HubModel")
    probe_run = apps.get_model("registry", "ProbeRun")
    model_event = apps.get_model("registry", "ModelEvent")
    subscription = apps.get_model("alerts", "Subscription")
    spelled = hub_model.objects.annotate(key=Lower("repo_id"))
    repeated = (
        spelled.values("key").annotate(rows=Count("id")).filter(rows__gt=1).values_list("key")
    )
    for (key,) in repeated:
        kept, *others = spelled.filter(key=key).order_by("id")
        for other in others:
            probe_run.objects.filter(model=other).update(model=kept)
            model_event.objects.filter(model=other).update(model=kept)
            for wish in subscription.objects.filter(model=other):
                twin = subscription.objects.filter(
                    model=kept, user_id=wish.user_id, channel_id=wish.channel_id
                ).first()
                if twin is None:
                    wish.model = kept
                    wish.save(update_fields=["model"])
                    continue
                for flag in SUBSCRIPTION_FLAGS:
                    setattr(twin, flag, getattr(twin, flag) or getattr(wish, flag))
                twin.save(update_fields=list(SUBSCRIPTION_FLAGS))
                wish.delete()
            other.delete()
    if schema_editor.connection.vendor == "postgresql":
        # The moved and deleted rows' foreign key checks wait for the commit; the table must
        # have none pending before the index is added to it in the same transaction.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0020_sync_failing_index"),
        ("alerts", "0004_team_invitation"),
    ]

    operations = [
        migrations.RunPython(merge_spellings, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="hubmodel",
            constraint=models.UniqueConstraint(Lower("repo_id"), name="one_model_per_repo_id"),
        ),
    ]
