from django.db import migrations

from audit.migrations_sql import protect, run_sql_on_postgres

forward, backward = protect("runs_historyevent")


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial"), ("audit", "0002_append_only")]
    operations = [migrations.RunPython(run_sql_on_postgres(forward), run_sql_on_postgres(backward))]
