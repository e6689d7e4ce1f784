"""/api/v1/fleet: preview, start, follow, halt -- role-checked, bad input answered 4xx naming the field."""

from __future__ import annotations

import pytest

from interventions.fleet.waves import run_fleet_wave
from interventions.models import FleetOperation
from tests.interventions.helpers import running_run

pytestmark = pytest.mark.django_db


def _body(ids, **extra):
    return {"kind": "pause", "filter": "&".join(f"id={i}" for i in ids), **extra}


def test_it_previews_starts_follows_and_halts_an_operation(worker, as_user):
    ids = [running_run(worker)[0]["id"] for _ in range(3)]
    otto = as_user("otto")
    preview = otto.post("/fleet/preview", _body(ids, wave_size=2, pause_s=30))
    assert preview.status_code == 200, preview.content
    shown = preview.json()
    assert (shown["will_act_on"], shown["waves"], shown["max_failures"]) == (3, 2, 0)
    started = otto.post(
        "/fleet",
        _body(ids, wave_size=2, pause_s=30, reason="stop the bleed", digest=shown["digest"]),
    )
    assert started.status_code == 202, started.content
    op = started.json()
    assert (op["state"], op["total"], op["pending"]) == ("running", 3, 3)
    run_fleet_wave(f"{op['id']}:1")
    progress = otto.get(f"/fleet/{op['id']}").json()
    assert (progress["succeeded"], progress["current_wave"]) == (2, 2)
    assert progress["wave_progress"][0] == {
        "wave": 1,
        "total": 2,
        "succeeded": 2,
        "failed": 0,
        "skipped": 0,
        "pending": 0,
    }
    receipts = [t["intervention_id"] for t in progress["targets"] if t["intervention_id"]]
    assert len(receipts) == 2
    assert otto.get(f"/interventions/{receipts[0]}").json()["kind"] == "pause"
    halted = as_user("olga").post(f"/fleet/{op['id']}/halt", {"reason": "enough"})
    assert halted.status_code == 200, halted.content
    assert (halted.json()["state"], halted.json()["skipped"]) == ("halted", 1)
    again = otto.post(f"/fleet/{op['id']}/halt", {"reason": "enough"})
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    listed = otto.get("/fleet").json()["operations"]
    assert [o["id"] for o in listed] == [op["id"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "explode"}, "kind"),
        ({"wave_size": 0}, "wave_size"),
        ({"pause_s": -1}, "pause_s"),
        ({"max_failure_pct": 101}, "max_failure_pct"),
        ({"filter": "state=exploded"}, "filter.state"),
        ({"filter": "id=xyz"}, "filter.id"),
        ({"filter": f"id={'a' * 32}&id=xyz"}, "filter.id"),
        ({"filter": "colour=red"}, "filter.colour"),
        ({"filter": "limit=5"}, "filter"),  # paging only: no runs chosen
        ({"filter": "state=running&colour=red"}, "filter.colour"),  # never silently widened
        ({"kind": "freeze_capability", "options": {"scope": "payments"}}, "options.scope"),
        ({"kind": "freeze_capability"}, "kind"),  # retired: the standing freeze (/fleet/freezes)
        ({"kind": "restore_capability", "options": {"scope": "payments:*"}}, "kind"),
        ({"options": {"surprise": 1}}, "options.surprise"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(body, field, worker, as_user):
    run_id = running_run(worker)[0]["id"]
    resp = as_user("ian").post("/fleet/preview", {**_body([run_id]), **body})
    assert resp.status_code == 422, resp.content
    assert resp.json()["field"] == field, resp.json()


def test_a_start_needs_a_reason(worker, as_user):
    run_id = running_run(worker)[0]["id"]
    resp = as_user("otto").post("/fleet", _body([run_id]))
    assert resp.status_code == 422 and resp.json()["field"] == "reason"


@pytest.mark.parametrize(
    ("user", "kind", "status"),
    [
        ("vera", "pause", 403),
        ("april", "cancel", 403),
        ("otto", "take_command", 403),
        ("april", "take_command", 403),
        ("otto", "cancel", 202),
        ("ian", "take_command", 202),
        ("sam", "freeze_capability", 422),  # retired: a standing freeze (/fleet/freezes)
    ],
)
def test_roles_are_checked(user, kind, status, worker, as_user):
    run_id = running_run(worker)[0]["id"]
    body = _body([run_id], kind=kind, reason="incident", options={"scope": "payments:charge"})
    if kind not in ("freeze_capability", "restore_capability"):
        body["options"] = {}
    resp = as_user(user).post("/fleet", body)
    assert resp.status_code == status, resp.content
    if status == 403:
        assert resp.json()["error"] == "forbidden"


def test_a_worker_token_is_refused(worker):
    run_id = running_run(worker)[0]["id"]
    assert worker.post("/fleet", _body([run_id], reason="x")).status_code == 403
    assert worker.post("/fleet/preview", _body([run_id])).status_code == 403
    assert not FleetOperation.objects.exists()


def test_an_unknown_operation_is_404(as_user):
    resp = as_user("otto").get("/fleet/00000000-0000-0000-0000-000000000000")
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"


def test_a_held_operation_waits_for_its_confirm_or_is_cancelled(worker, as_user):
    ids = [running_run(worker)[0]["id"] for _ in range(2)]
    otto = as_user("otto")
    held = otto.post("/fleet", _body(ids, reason="change window at 02:00", hold=True))
    assert held.status_code == 202, held.content
    op = held.json()
    assert (op["state"], op["pending"]) == ("previewed", 2)
    assert otto.post(f"/fleet/{op['id']}/halt", {"reason": "x"}).status_code == 409
    assert as_user("olga").post(f"/fleet/{op['id']}/confirm").status_code == 403  # not hers
    confirmed = otto.post(f"/fleet/{op['id']}/confirm")
    assert confirmed.status_code == 202 and confirmed.json()["state"] == "running"
    run_fleet_wave(f"{op['id']}:1")
    assert otto.get(f"/fleet/{op['id']}").json()["state"] == "completed"

    other = otto.post("/fleet", _body(ids, kind="resume", reason="later", hold=True)).json()
    cancelled = as_user("olga").post(f"/fleet/{other['id']}/cancel", {"reason": "not needed"})
    assert cancelled.status_code == 200, cancelled.content
    assert (cancelled.json()["state"], cancelled.json()["skipped"]) == ("cancelled", 2)
    assert otto.post(f"/fleet/{other['id']}/confirm").status_code == 409
