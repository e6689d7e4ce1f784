"""Per-chain audit (issue 11): one chain per run plus a ``system`` chain, instead of one global chain
whose head row every decision locked.

The rows written before stay exactly as they were, as the frozen ``legacy`` chain: their position in it
(``chain_seq``) is their old global ``seq`` and their hashes are untouched, so they verify as before and
old anchors (v1: seq, hash of the single chain) are checked against it. The old singleton head becomes
the legacy chain's row in ``audit_auditchain``. New rows take their global ``seq`` (reading order only)
from a sequence that starts after the last legacy row.
"""

import django.utils.timezone
from django.db import migrations, models
from django.db.models import F

GENESIS = "0" * 64


def split_chains(apps, schema_editor):
    AuditEvent = apps.get_model("audit", "AuditEvent")
    AuditChainHead = apps.get_model("audit", "AuditChainHead")
    AuditChain = apps.get_model("audit", "AuditChain")
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # The append-only triggers refuse this UPDATE; the migration runs as the table's owner and
            # switches them off for this one statement, in this transaction (ALTER TABLE locks the table).
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER USER")
            cursor.execute("UPDATE audit_auditevent SET chain_seq = seq")
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER USER")
            cursor.execute("SELECT coalesce(max(seq), 0) FROM audit_auditevent")
            (top,) = cursor.fetchone()
            cursor.execute("CREATE SEQUENCE IF NOT EXISTS audit_event_order")
            cursor.execute("SELECT setval('audit_event_order', %s, %s)", [max(top, 1), top > 0])
            cursor.execute(
                "ALTER TABLE audit_auditchain ADD COLUMN xid xid8 NOT NULL "
                "DEFAULT pg_current_xact_id()"
            )
    else:
        AuditEvent.objects.update(chain_seq=F("seq"))
    head = AuditChainHead.objects.filter(id=1).first()
    if head and head.seq:
        before = AuditEvent.objects.filter(seq=head.seq - 1).values_list("hash", flat=True).first()
        AuditChain.objects.create(
            key="legacy", seq=head.seq, hash=head.hash, prev_hash=before or GENESIS
        )


def drop_sequence(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("DROP SEQUENCE IF EXISTS audit_event_order")


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0003_audit_created_at_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditChain",
            fields=[
                ("key", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("seq", models.BigIntegerField(default=0)),
                ("hash", models.CharField(max_length=64)),
                ("prev_hash", models.CharField(max_length=64)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.AddField(
            model_name="auditevent",
            name="chain",
            field=models.CharField(default="legacy", max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="auditevent",
            name="chain_seq",
            field=models.BigIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.RunPython(split_chains, drop_sequence),
        migrations.AddConstraint(
            model_name="auditevent",
            constraint=models.UniqueConstraint(
                fields=("chain", "chain_seq"), name="audit_chain_position"
            ),
        ),
        migrations.DeleteModel(name="AuditChainHead"),
    ]
