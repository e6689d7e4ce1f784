"""``manage.py demo_bump_tool_version [TOOL] [--to VERSION]``: the demo's deployment of a new tool
version (default: payments, its last number plus one). Every agent whose workers report that tool
now reports the new version (one audited ``agent.versions`` decision per agent), and the demo
agents pick it up for their next claims and new runs (var/demo-tool-versions.json, read by
demo_agents/common.py). A run that started on the old version and is paused now cannot be resumed
as it was: the resume's version check blocks it (docs/operations/demo.md, "Four eyes and versions").
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from core.actors import system_actor
from runs.models import Agent
from runs.services.agents import record_deployed_versions

VERSIONS_FILE = "demo-tool-versions.json"


def bumped(version: str) -> str:
    """3.1 -> 3.2, 1.0.9 -> 1.0.10; a version without a trailing number gets ".1"."""
    head, _, last = str(version).rpartition(".")
    if last.isdigit():
        return f"{head}.{int(last) + 1}" if head else str(int(last) + 1)
    return f"{version}.1"


class Command(BaseCommand):
    help = (
        "Deploy a new tool version to the demo agents (audited), so resume's version check blocks."
    )

    def add_arguments(self, parser):
        parser.add_argument("tool", nargs="?", default="payments")
        parser.add_argument("--to", dest="to", default="", help="the new version (default: bump)")

    def handle(self, *args, **opts):
        tool, actor = opts["tool"], system_actor("demo_bump_tool_version", name="manage.py")
        agents = [
            a
            for a in Agent.objects.order_by("name")
            if tool in (a.current_versions or {}).get("tools", {})
        ]
        if not agents:
            raise CommandError(
                f"no agent's workers report a {tool!r} version yet: start the demo (make run) first"
            )
        old = agents[0].current_versions["tools"][tool]
        new = opts["to"] or bumped(old)
        for agent in agents:
            record_deployed_versions(actor=actor, agent=agent.name, tools={tool: new})
        path = Path(settings.VAR_DIR) / VERSIONS_FILE
        deployed = json.loads(path.read_text()) if path.exists() else {}
        deployed[tool] = new
        path.write_text(json.dumps(deployed, indent=2) + "\n")
        names = ", ".join(a.name for a in agents)
        self.stdout.write(
            f"{tool} {old} -> {new} for {names} (audited: agent.versions).\n"
            f"The demo agents report {tool} {new} from their next claim ({path}).\n"
            f"Pause a run that started on {tool} {old}, then resume it: the version check blocks it."
        )
