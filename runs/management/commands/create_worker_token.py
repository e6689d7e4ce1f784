from django.core.management.base import BaseCommand, CommandError

from runs.models import Agent, ApiToken


class Command(BaseCommand):
    help = "Create a worker token (printed once, as the last line). Without --agent it may act for any agent."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--agent", action="append", default=[])

    def handle(self, *args, name, agent, **opts):
        missing = [a for a in agent if not Agent.objects.filter(name=a).exists()]
        if missing:
            raise CommandError(f"unknown agent(s): {', '.join(missing)} (register_agent first)")
        token, secret = ApiToken.issue(kind=ApiToken.WORKER, name=name, agents=agent)
        self.stdout.write(
            f"worker token {token.prefix}… for {', '.join(agent) or 'any agent'}; store it now, it is not shown again:"
        )
        self.stdout.write(secret)
