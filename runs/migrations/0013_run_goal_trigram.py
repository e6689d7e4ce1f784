"""The search box's goal text (``goal__icontains``, i.e. ``UPPER(goal) LIKE UPPER('%…%')``) through a
trigram index on ``UPPER(goal)`` (pg_trgm): a substring search reads the matching runs, not all of
them. PostgreSQL only; SQLite (the demo) has no pg_trgm and scans, which is fine at its size."""

from django.db import migrations

INDEX = "run_goal_trgm"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON runs_run USING gin (UPPER(goal) gin_trgm_ops)"
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("runs", "0012_capability_freeze")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
