"""The registry takes over the domain tables that `workers` and `dashboard` held.

ModelEvent, Lease and ProbeRun (from workers) and CatalogVerdict (from dashboard) change owner:
first the registry adopts each table as it is (state only: no row is touched), then each table
is renamed to the registry's name. The old apps drop them from their state in their own
migrations, after this one (workers 0005, dashboard 0004), and alerts points its foreign key
at the registry's ModelEvent (alerts 0002).
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0003_tokenizer_file"),
        ("workers", "0004_probe_run"),
        ("dashboard", "0003_probe_verdicts"),
        # Tables whose foreign keys point at a renamed table are created first.
        ("alerts", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ModelEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("template_changed", "Template changed"),
                                    ("verdict_changed", "Verdict changed"),
                                    ("probe_changed", "Probe result changed"),
                                    ("status_changed", "Repo gated or gone"),
                                ],
                                db_index=True,
                                max_length=32,
                            ),
                        ),
                        ("key", models.CharField(max_length=200, unique=True)),
                        ("summary", models.TextField()),
                        ("data", models.JSONField(blank=True, default=dict)),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("notify_claimed_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "model",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="events",
                                to="registry.hubmodel",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "workers_modelevent",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="Lease",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("key", models.CharField(max_length=200, unique=True)),
                        ("holder", models.CharField(max_length=255)),
                        ("expires_at", models.DateTimeField()),
                    ],
                    options={"db_table": "workers_lease"},
                ),
                migrations.CreateModel(
                    name="ProbeRun",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("commit_sha", models.CharField(blank=True, max_length=40)),
                        ("quantization", models.CharField(blank=True, max_length=100)),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("queued", "Waiting for the Mac worker"),
                                    ("running", "Running"),
                                    ("done", "Done"),
                                    ("error", "Failed"),
                                ],
                                db_index=True,
                                default="queued",
                                max_length=16,
                            ),
                        ),
                        (
                            "verdict",
                            models.CharField(
                                blank=True,
                                choices=[
                                    ("hit", "Cache reused"),
                                    ("partial", "Partly reused"),
                                    ("miss", "Cache lost"),
                                    ("wrong", "Wrong output from cache"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("reused_share", models.FloatField(blank=True, null=True)),
                        ("disagreement", models.BooleanField(default=False)),
                        ("worker", models.CharField(blank=True, max_length=255)),
                        ("machine", models.JSONField(blank=True, default=dict)),
                        ("report", models.JSONField(blank=True, null=True)),
                        ("error", models.TextField(blank=True)),
                        (
                            "queued_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "model",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="probe_runs",
                                to="registry.hubmodel",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "workers_proberun",
                        "ordering": ["-queued_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="CatalogVerdict",
                    fields=[
                        (
                            "model",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                primary_key=True,
                                related_name="catalog_verdict",
                                serialize=False,
                                to="registry.hubmodel",
                            ),
                        ),
                        (
                            "thinking",
                            models.CharField(
                                choices=[
                                    ("none", "No thinking switch"),
                                    ("same", "Same verdict either way"),
                                    ("differs", "Depends on thinking"),
                                ],
                                db_index=True,
                                default="none",
                                max_length=16,
                            ),
                        ),
                        (
                            "thinking_off",
                            models.CharField(
                                blank=True,
                                choices=[
                                    ("pending", "Not checked yet"),
                                    ("safe", "Cache-safe"),
                                    ("unsafe", "Breaks the cache"),
                                    ("safe_where_renderable", "Safe where it renders"),
                                    ("error", "Does not render"),
                                ],
                                max_length=32,
                            ),
                        ),
                        (
                            "thinking_on",
                            models.CharField(
                                blank=True,
                                choices=[
                                    ("pending", "Not checked yet"),
                                    ("safe", "Cache-safe"),
                                    ("unsafe", "Breaks the cache"),
                                    ("safe_where_renderable", "Safe where it renders"),
                                    ("error", "Does not render"),
                                ],
                                max_length=32,
                            ),
                        ),
                        (
                            "tools",
                            models.CharField(
                                choices=[
                                    ("safe", "Tools keep the cache"),
                                    ("unsafe", "Tools break the cache"),
                                    ("unsupported", "No tool support"),
                                    ("unknown", "Not checked"),
                                ],
                                db_index=True,
                                default="unknown",
                                max_length=16,
                            ),
                        ),
                        (
                            "probe",
                            models.CharField(
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
                        ("variants", models.JSONField(blank=True, default=list)),
                    ],
                    options={"db_table": "dashboard_catalogverdict"},
                ),
            ],
            database_operations=[],
        ),
        migrations.AlterModelTable(name="modelevent", table=None),
        migrations.AlterModelTable(name="lease", table=None),
        migrations.AlterModelTable(name="proberun", table=None),
        migrations.AlterModelTable(name="catalogverdict", table=None),
    ]
