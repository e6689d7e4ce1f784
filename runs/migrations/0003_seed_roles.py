from django.db import migrations

ROLES = ["viewer", "operator", "approver", "incident_commander", "security_responder", "admin"]


def seed(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
