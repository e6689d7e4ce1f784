from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import DomainError
from runs.models import ApiToken
from runs.services.access import issue_token


class Command(BaseCommand):
    help = "Create a personal operator token acting as USERNAME (printed once, as the last line)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="")

    def handle(self, *args, username, name, **opts):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        try:
            token, secret = issue_token(
                actor=system_actor("create_api_token", name="manage.py"),
                kind=ApiToken.OPERATOR,
                name=name or f"{username}-token",
                user=user,
            )
        except DomainError as err:
            raise CommandError(err.detail)
        self.stdout.write(
            f"operator token {token.prefix}… for {username}; store it now, it is not shown again:"
        )
        self.stdout.write(secret)
