from django.core.management.base import BaseCommand, CommandError

from core.errors import DomainError
from runs.services.accounts import cli_actor, register_agent


class Command(BaseCommand):
    help = "Register (or update) an agent and the authority scopes its runs may hold."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--scope", action="append", default=[], help="tool:action or tool:* (repeatable)"
        )
        parser.add_argument("--description", default="")

    def handle(self, *args, name, scope, description, **opts):
        try:
            agent, created = register_agent(
                actor=cli_actor(), name=name, scopes=scope, description=description
            )
        except DomainError as err:
            raise CommandError(err.detail)
        self.stdout.write(
            f"{'registered' if created else 'updated'} agent {agent.name} "
            f"with scopes {', '.join(scope) or '(none)'}"
        )
