from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from runs.models import ApiToken


class Command(BaseCommand):
    help = "Revoke a token by its visible prefix."

    def add_arguments(self, parser):
        parser.add_argument("prefix")

    def handle(self, *args, prefix, **opts):
        n = ApiToken.objects.filter(prefix=prefix, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if not n:
            raise CommandError(f"no live token with prefix {prefix!r}")
        self.stdout.write(f"revoked {n} token(s)")
