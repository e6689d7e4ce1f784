from django.core.management.base import BaseCommand, CommandError

from runs.models import Agent


class Command(BaseCommand):
    help = "Register (or update) an agent and the authority scopes its runs may hold."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--scope", action="append", default=[], help="tool:action or tool:* (repeatable)"
        )
        parser.add_argument("--description", default="")

    def handle(self, *args, name, scope, description, **opts):
        for s in scope:
            tool, sep, action = s.partition(":")
            if not (tool and sep and action):
                raise CommandError(f"scope {s!r} must look like tool:action or tool:*")
        agent, created = Agent.objects.update_or_create(
            name=name, defaults={"allowed_scopes": scope, "description": description}
        )
        self.stdout.write(
            f"{'registered' if created else 'updated'} agent {agent.name} with scopes {', '.join(scope) or '(none)'}"
        )
