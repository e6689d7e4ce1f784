from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from core.roles import ROLES


class Command(BaseCommand):
    help = "Create the role groups (idempotent; the migration does this too)."

    def handle(self, *args, **opts):
        for name in ROLES:
            Group.objects.get_or_create(name=name)
        self.stdout.write(f"roles: {', '.join(ROLES)}")
