# The compensation's own idempotency key, fixed when the plan is built (0002 shipped without it).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("interventions", "0002_compensation_plans"),
    ]

    operations = [
        migrations.AddField(
            model_name="compensationstep",
            name="idempotency_key",
            field=models.CharField(default="", max_length=200),
            preserve_default=False,
        ),
    ]
