"""seed_demo seeds the teams payments and support (docs/operations/demo.md, "Teams"), idempotently,
without moving the demo's agents out of the default team (the demo runs as before)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from audit.models import AuditEvent
from runs.models import Agent, Team, TeamMembership

pytestmark = pytest.mark.django_db


def test_the_demo_seeds_two_teams_and_mo_gets_the_switcher(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    for _ in range(2):  # idempotent
        call_command("seed_demo", stdout=StringIO())
    assert sorted(Team.objects.values_list("slug", flat=True)) == ["default", "payments", "support"]
    assert TeamMembership.objects.filter(user__username="mo").count() == 3
    assert AuditEvent.objects.filter(action="team.member_added").count() == 5
    assert not Agent.objects.filter(team__isnull=False).exists()
    mo, pat = Client(), Client()
    assert mo.login(username="mo", password="controlplane-demo")
    assert pat.login(username="pat", password="controlplane-demo")
    assert b'data-testid="team-switcher"' in mo.get("/").content
    assert b'data-testid="team-switcher"' not in pat.get("/").content
