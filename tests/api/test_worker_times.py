"""Worker-written times (core.times): refused at the edge naming the field; and a stored one Python
cannot read back (put there by raw SQL, as an older release or a hand fix could) degrades that one
run's view and says so -- its page, dialog, preview, pause, resume and the timer beat keep working,
and other runs' timers still fire."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from core.actors import system_actor
from interventions.resume import revalidate_run
from runs.models import Assumption, Run, Timer
from runs.services.records import fire_due_timers
from tests.conftest import claim, start_run
from tests.interventions.helpers import intervene

pytestmark = pytest.mark.django_db

# PostgreSQL stores both; in UTC they are year 0 and year 10000, which psycopg cannot load.
UNREADABLE = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-14:00"]


def events(worker, run_id: str, *evs: dict):
    return worker.post(f"/runs/{run_id}/events", {"fencing_token": 1, "events": list(evs)})


@pytest.mark.parametrize("bad", UNREADABLE)
def test_every_worker_written_time_is_refused_naming_its_field(worker, bad):
    run = start_run(worker)
    claim(worker, run["id"])
    cases = {
        "events.0.data.fire_at": lambda: events(
            worker, run["id"], {"kind": "timer_set", "data": {"name": "t", "fire_at": bad}}
        ),
        "events.0.data.observed_at": lambda: events(
            worker, run["id"], {"kind": "assumption", "data": {"key": "k", "observed_at": bad}}
        ),
        "events.0.data.meta.at": lambda: events(
            worker, run["id"], {"kind": "log", "data": {"meta": {"at": bad}}}
        ),
        "state.when": lambda: worker.post(
            f"/runs/{run['id']}/checkpoints",
            {"fencing_token": 1, "step": "s", "state": {"when": bad}},
        ),
        "input.ship_by": lambda: worker.post(
            "/runs", {"agent": "purchasing", "goal": "g", "input": {"ship_by": bad}}
        ),
        "deadline": lambda: worker.post(
            "/runs", {"agent": "purchasing", "goal": "g", "deadline": bad}
        ),
    }
    for field, send in cases.items():
        resp = send()
        assert resp.status_code == 422, (field, resp.content)
        assert resp.json()["field"] == field, resp.json()
    assert not Timer.objects.exists() and not Assumption.objects.exists()
    assert Run.objects.count() == 1


def test_outcome_details_with_an_unreadable_time_are_refused(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    effect = worker.post(
        f"/runs/{run['id']}/effects",
        {
            "fencing_token": 1,
            "step": "charge",
            "tool": "payments",
            "action": "charge",
            "idempotency_key": "k1",
            "args": {"amount": 1},
        },
    ).json()
    resp = worker.post(
        f"/effects/{effect['id']}/outcome",
        {"fencing_token": 1, "status": "committed", "detail": {"settled_at": UNREADABLE[0]}},
    )
    assert resp.status_code == 422 and resp.json()["field"] == "detail.settled_at", resp.content


def test_a_typed_time_outside_the_window_is_refused_by_the_one_parser(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    for bad, why in [("1990-01-01T00:00:00Z", "between"), ("2030-13-01T00:00:00Z", "ISO 8601")]:
        resp = events(
            worker, run["id"], {"kind": "timer_set", "data": {"name": "t", "fire_at": bad}}
        )
        assert resp.status_code == 422, resp.content
        assert resp.json()["field"] == "events[0].data.fire_at" and why in resp.json()["detail"]
    ok = events(
        worker,
        run["id"],
        {"kind": "timer_set", "data": {"name": "t", "fire_at": "2030-01-01T00:00Z"}},
    )
    assert ok.status_code == 201, ok.content


def _store_unreadable(run_id: str, value: str) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runs_timer SET fire_at = %s::timestamptz WHERE run_id = %s", [value, run_id]
        )
        cur.execute(
            "UPDATE runs_assumption SET observed_at = %s::timestamptz WHERE run_id = %s",
            [value, run_id],
        )


@pytest.mark.parametrize("bad", UNREADABLE)
def test_a_stored_unreadable_time_degrades_one_run_and_stops_nothing(worker, as_user, cast, bad):
    run = start_run(worker)
    lease = claim(worker, run["id"])["lease"]
    other = start_run(worker)
    claim(worker, other["id"])
    assert (
        events(
            worker,
            run["id"],
            {"kind": "timer_set", "data": {"name": "t", "in_s": 0}},
            {"kind": "assumption", "data": {"key": "price", "value": 3, "max_age_s": 3600}},
        ).status_code
        == 201
    )
    assert (
        events(
            worker, other["id"], {"kind": "timer_set", "data": {"name": "t2", "in_s": 0}}
        ).status_code
        == 201
    )
    _store_unreadable(run["id"], bad)

    otto = Client()
    assert otto.login(username="otto", password="pw-otto")
    assert otto.get(f"/runs/{run['id']}/").status_code == 200
    dialog = otto.get(
        f"/runs/{run['id']}/interventions/new/", {"kind": "pause"}, HTTP_HX_REQUEST="true"
    )
    assert dialog.status_code == 200, dialog.content.decode()[:2000]
    assert b"unreadable" in dialog.content  # the timer's row says so
    api = as_user("otto")
    assert api.get(f"/runs/{run['id']}").status_code == 200
    preview = api.post(f"/runs/{run['id']}/interventions/preview", {"kind": "pause"})
    assert preview.status_code == 200, preview.content
    (timer,) = list(_walk(preview.json(), "timers"))
    assert timer["fire_at"] is None and timer["unreadable"]

    # The beat: the other run's due timer fires whatever this run's row holds.
    fire_due_timers(actor=system_actor("timers"))
    assert Timer.objects.get(run_id=other["id"]).status == Timer.FIRED

    assert intervene(api, run["id"], "pause").status_code == 202
    worker.post(f"/leases/{lease['id']}/release", {"fencing_token": 1, "reason": "paused"})
    assert Run.objects.get(pk=run["id"]).state == "paused"
    resumed = intervene(api, run["id"], "resume")
    assert resumed.status_code == 202, resumed.content
    report = revalidate_run(resumed.json()["id"])
    assert Run.objects.get(pk=run["id"]).state != "needs_attention", report
    stale = [c for c in _walk(report, "stale")]
    assert stale and stale[0]["observed_at"] is None and "unreadable" in stale[0]["problem"]


def _walk(doc, key):
    """Every item of every list stored under ``key`` anywhere in ``doc``."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key and isinstance(v, list):
                yield from v
            else:
                yield from _walk(v, key)
    elif isinstance(doc, list):
        for v in doc:
            yield from _walk(v, key)


def test_the_safe_time_loader_class_is_built_once_per_zone():
    """Every pool checkout registers the loader again: it is looked up, not rebuilt each time."""
    from datetime import UTC
    from zoneinfo import ZoneInfo

    from django.db.backends.postgresql.psycopg_any import BaseTzLoader

    from core import times

    first = times._safe_loader_class(BaseTzLoader, UTC)
    assert times._safe_loader_class(BaseTzLoader, UTC) is first
    other = times._safe_loader_class(BaseTzLoader, ZoneInfo("Europe/Paris"))
    assert other is not first and other.timezone == ZoneInfo("Europe/Paris")
    assert first.timezone is UTC
