"""``manage.py teams``: list teams, create one, add or remove a person, move an agent.

    manage.py teams list
    manage.py teams create payments [--name "Payments"]
    manage.py teams add payments alice        manage.py teams remove payments alice
    manage.py teams move-agent refund-agent payments

Every change goes through runs.services.teams (audited, refusals too).
"""

from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import DomainError
from runs.models import Agent, Team, TeamMembership
from runs.services import teams


class Command(BaseCommand):
    help = "List teams, create one, add or remove a member, move an agent to a team."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        sub.add_parser("list")
        create = sub.add_parser("create")
        create.add_argument("slug")
        create.add_argument("--name", default="")
        for verb in ("add", "remove"):
            p = sub.add_parser(verb)
            p.add_argument("slug")
            p.add_argument("username")
        move = sub.add_parser("move-agent")
        move.add_argument("agent")
        move.add_argument("slug")

    def handle(self, *args, verb, **opts):
        actor = system_actor("teams", name="manage.py")
        try:
            if verb == "list":
                self._list()
            elif verb == "create":
                team = teams.create_team(actor=actor, slug=opts["slug"], name=opts["name"])
                self.stdout.write(f"created team {team.slug}")
            elif verb == "add":
                teams.add_member(actor=actor, team=opts["slug"], username=opts["username"])
                self.stdout.write(f"added {opts['username']} to {opts['slug']}")
            elif verb == "remove":
                teams.remove_member(actor=actor, team=opts["slug"], username=opts["username"])
                self.stdout.write(f"removed {opts['username']} from {opts['slug']}")
            else:
                teams.move_agent(actor=actor, agent=opts["agent"], team=opts["slug"])
                self.stdout.write(f"moved agent {opts['agent']} to {opts['slug']}")
        except DomainError as err:
            raise CommandError(err.detail) from None

    def _list(self) -> None:
        for team in Team.objects.order_by("slug"):
            members = TeamMembership.objects.filter(team=team).values_list(
                "user__username", flat=True
            )
            agents = Agent.objects.filter(team=team).values_list("name", flat=True)
            self.stdout.write(
                f"{team.slug}: members {', '.join(sorted(members)) or '-'};"
                f" agents {', '.join(sorted(agents)) or '-'}"
            )
        loose = Agent.objects.filter(team__isnull=True).values_list("name", flat=True)
        self.stdout.write(f"default (no team): agents {', '.join(sorted(loose)) or '-'}")
