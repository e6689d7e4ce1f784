from django.core.management.base import BaseCommand

from core.roles import ROLES
from runs.services.accounts import cli_actor, ensure_roles


class Command(BaseCommand):
    help = "Create the role groups (idempotent; the migration does this too)."

    def handle(self, *args, **opts):
        created = ensure_roles(actor=cli_actor())
        self.stdout.write(
            f"roles: {', '.join(ROLES)}" + (f" (created {', '.join(created)})" if created else "")
        )
