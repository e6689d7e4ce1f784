from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import DomainError
from runs.models import ApiToken
from runs.services.access import issue_token


class Command(BaseCommand):
    help = (
        "Create a worker token (printed once, as the last line). "
        "Without --agent it may act for any agent."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--agent", action="append", default=[])
        parser.add_argument(
            "--team",
            default=None,
            help="the team whose runs it acts on (default: the default team)",
        )

    def handle(self, *args, name, agent, team, **opts):
        try:
            token, secret = issue_token(
                actor=system_actor("create_worker_token", name="manage.py"),
                kind=ApiToken.WORKER,
                name=name,
                agents=agent,
                team=team,
            )
        except DomainError as err:
            raise CommandError(err.detail)
        self.stdout.write(
            f"worker token {token.prefix}… for {', '.join(agent) or 'any agent'}"
            f" of team {team or 'default'}; "
            "store it now, it is not shown again:"
        )
        self.stdout.write(secret)
