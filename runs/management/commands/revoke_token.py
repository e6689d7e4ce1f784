from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import DomainError
from runs.services.access import revoke_token


class Command(BaseCommand):
    help = "Revoke a token by its visible prefix."

    def add_arguments(self, parser):
        parser.add_argument("prefix")

    def handle(self, *args, prefix, **opts):
        try:
            n = revoke_token(actor=system_actor("revoke_token", name="manage.py"), prefix=prefix)
        except DomainError as err:
            raise CommandError(err.detail)
        self.stdout.write(f"revoked {n} token(s)")
