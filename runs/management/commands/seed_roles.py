from django.core.management.base import BaseCommand

from core.actors import system_actor
from core.roles import ROLES
from runs.services.access import ensure_roles


class Command(BaseCommand):
    help = "Create the role groups (idempotent; the migration does this too)."

    def handle(self, *args, **opts):
        created = ensure_roles(actor=system_actor("seed_roles", name="manage.py"))
        self.stdout.write(
            f"roles: {', '.join(ROLES)}" + (f" (created {', '.join(created)})" if created else "")
        )
