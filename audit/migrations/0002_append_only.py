from django.db import migrations

from audit.migrations_sql import protect, run_sql_on_postgres

forward, backward = protect("audit_auditevent")


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(run_sql_on_postgres(forward), run_sql_on_postgres(backward))]
