from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from core.errors import Invalid, NotFound
from runs.services.agents import register_agent


class Command(BaseCommand):
    help = (
        "Register (or update) an agent, the authority scopes its runs may hold and its approval "
        "policies (--approval 'payments:charge amount>200 approver')."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--scope", action="append", default=[], help="tool:action or tool:* (repeatable)"
        )
        parser.add_argument("--description", default="")
        parser.add_argument(
            "--approval",
            action="append",
            default=None,
            help="approval policy 'TOOL:ACTION [FIELD OP LITERAL] [ROLE]', or with steps such as "
            "'payments:charge 2*approver then 2*team:payments' (repeatable; "
            "docs/operator/approvals.md); given at all, it replaces the agent's policies; "
            "--no-approvals removes them",
        )
        parser.add_argument("--no-approvals", action="store_true")
        parser.add_argument(
            "--team",
            default=None,
            help="the team the agent belongs to (default: keep; new: default)",
        )

    def handle(self, *args, name, scope, description, approval, no_approvals, team, **opts):
        approvals = [] if no_approvals else approval
        try:
            agent, created = register_agent(
                actor=system_actor("register_agent", name="manage.py"),
                name=name,
                scopes=scope,
                description=description,
                approvals=approvals,
                team=team,
            )
        except (Invalid, NotFound) as err:
            raise CommandError(err.detail) from None
        policies = [p.spec for p in agent.approval_policies.all()]
        self.stdout.write(
            f"{'registered' if created else 'updated'} agent {agent.name} with scopes "
            f"{', '.join(scope) or '(none)'}; approval policies: {'; '.join(policies) or '(none)'}"
        )
