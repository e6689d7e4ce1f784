from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import DomainError
from core.roles import ROLES
from runs.services.access import set_user_roles


class Command(BaseCommand):
    help = f"Make ROLE... exactly USERNAME's roles (none = no role). Roles: {', '.join(ROLES)}."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("roles", nargs="*")

    def handle(self, *args, username, roles, **opts):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        try:
            before, after = set_user_roles(
                actor=system_actor("set_roles", name="manage.py"), user=user, roles=roles
            )
        except DomainError as err:
            raise CommandError(err.detail)
        self.stdout.write(
            f"{username}: {', '.join(before) or '(none)'} -> {', '.join(after) or '(none)'}"
        )
