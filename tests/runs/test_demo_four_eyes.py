"""The demo shows four eyes and the version check (issue 18, item 10): seed_demo's requester, rita,
starts purchases in person with her own token; she holds the approver role, yet may not decide the
approval of a run she started, and april may. ``demo_bump_tool_version`` deploys a new tool version
(audited), and a paused run that started on the old one is blocked when resumed."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from audit.models import AuditEvent
from interventions.models import Intervention
from interventions.resume import revalidate_run
from runs.management.commands.demo_bump_tool_version import bumped
from runs.management.commands.seed_demo import REQUESTER_TOKEN_FILE
from runs.models import Agent, Approval, Run
from tests.conftest import Api, claim, start_run
from tests.interventions.helpers import intervene

pytestmark = pytest.mark.django_db

BIG = {"amount": 450, "currency": "EUR"}


def _call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def seeded(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    _call("seed_demo")
    return tmp_path


def test_a_purchase_rita_started_cannot_be_approved_by_her_but_by_april(seeded):
    from django.contrib.auth.models import User

    rita = User.objects.get(username="rita")
    assert set(rita.groups.values_list("name", flat=True)) == {"operator", "approver"}
    requester = Api(Client(), (seeded / REQUESTER_TOKEN_FILE).read_text().strip())
    run = start_run(
        requester, agent="purchasing", authority=[{"scope": "payments:charge", "ttl_s": 60}]
    )
    assert Run.objects.get(pk=run["id"]).created_by == "user:rita"  # a person's purchase

    from runs.models import ApiToken

    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="w", agents=["purchasing"])
    worker = Api(Client(), secret)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    asked = worker.post(
        f"/runs/{run['id']}/approvals",
        {"fencing_token": token, "tool": "payments", "action": "charge", "args": BIG},
    )
    assert asked.status_code == 201, asked.content
    approval = asked.json()["id"]

    # rita, in the console, with the approver role: the dialog opens, her confirm is refused, and
    # the refusal is audited
    def decide(username: str):
        from tests.console.test_dialogs import confirm, open_dialog, token_of

        console = Client()
        console.force_login(User.objects.get(username=username))
        dialog = open_dialog(console, run["id"], "approve", approval_id=approval, origin="inbox")
        return confirm(
            console,
            run["id"],
            "approve",
            token_of(dialog.content),
            approval_id=approval,
            reason="checked the order",
            origin="inbox",
        )

    mine = decide("rita")
    assert mine.status_code == 403 and b"separation_of_duties" in mine.content, mine.content[:400]
    assert AuditEvent.objects.filter(actor="rita", outcome="denied").exists()
    assert Approval.objects.get(pk=approval).status == "pending"
    ok = decide("april")
    assert ok.status_code in (200, 202), ok.content[:400]
    assert Approval.objects.get(pk=approval).status == "approved"


def test_traffic_starts_some_approval_purchases_in_person(monkeypatch):
    import random

    from demo_agents import traffic

    made: list[str] = []

    class Fake:
        def __init__(self, who: str):
            self.who = who

        def create_run(self, *args, **kwargs):
            made.append(self.who)
            return {"id": "r", "goal": args[1]}

    t = traffic.Traffic(
        Fake("worker"),
        None,
        random.Random(7),
        max_active=8,
        max_approvals=2,
        threshold=200.0,
        requester=Fake("rita"),
    )
    for _ in range(20):
        t.make("approval")
    for _ in range(5):
        t.make("ok")
    assert 0 < made[:20].count("rita") < 20  # some approval purchases are hers, not all
    assert made[20:] == ["worker"] * 5  # ordinary purchases stay the agents'


def test_the_bump_command_deploys_a_new_version_and_a_paused_runs_resume_is_blocked(
    settings, tmp_path, worker, as_user
):
    settings.VAR_DIR = tmp_path
    assert bumped("3.1") == "3.2" and bumped("1.0.9") == "1.0.10" and bumped("beta") == "beta.1"
    run = start_run(worker)
    versions = {"code": "1.0.0", "model": "m-1", "tools": {"payments": "3.1"}, "config_hash": "abc"}
    resp = worker.post(f"/runs/{run['id']}/claim", {"worker": "w1", "versions": versions})
    assert resp.status_code == 200
    otto = as_user("otto")
    assert intervene(otto, run["id"], "pause").status_code == 202

    out = _call("demo_bump_tool_version", "payments")
    assert "payments 3.1 -> 3.2" in out
    agent = Agent.objects.get(name="purchasing")
    assert agent.current_versions["tools"]["payments"] == "3.2"
    [event] = AuditEvent.objects.filter(action="agent.versions")
    assert event.context["before"]["tools"]["payments"] == "3.1"
    assert event.context["after"]["tools"]["payments"] == "3.2"
    # the demo agents' next claims and new runs report it (demo_agents/common.py follows this file)
    assert json.loads((tmp_path / "demo-tool-versions.json").read_text()) == {"payments": "3.2"}

    resumed = intervene(otto, run["id"], "resume", "world checked")
    assert resumed.status_code == 202
    revalidate_run(resumed.json()["id"])
    blocked = Intervention.objects.get(pk=resumed.json()["id"])
    assert blocked.status == "failed" and "versions" in blocked.receipt["job"]["report"]["failing"]
    assert Run.objects.get(pk=run["id"]).state == "paused"


def test_the_demo_agents_pick_up_a_deployed_version(tmp_path, monkeypatch):
    import time

    from demo_agents import common

    monkeypatch.setenv("CONTROLPLANE_VAR_DIR", str(tmp_path))
    monkeypatch.setitem(common.VERSIONS, "tools", dict(common.VERSIONS["tools"]))
    (tmp_path / "demo-tool-versions.json").write_text('{"payments": "9.9"}')
    import threading

    stop = threading.Event()
    common.follow_deployed_versions(every_s=0.05, stop=stop)
    deadline = time.monotonic() + 5
    while common.VERSIONS["tools"]["payments"] != "9.9" and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    assert common.VERSIONS["tools"]["payments"] == "9.9"


def test_the_bump_command_says_what_to_do_before_any_worker_reported():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="start the demo"):
        _call("demo_bump_tool_version", "payments")
