"""The state machine table, edge by edge, and the services refusing what the table forbids.

The table (runs/states.py) is the single source of truth: these tests are generated from it, so a
new state or event is walked automatically.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from audit.models import AuditEvent
from core.actors import system_actor
from core.errors import Conflict
from runs.models import Approval, ExecutionLease, HistoryEvent, Run
from runs.services.decisions import apply_transition, lock_run
from runs.states import (
    DENIAL_BY_STATE,
    DIRECTIVES,
    EFFECT_STATES,
    FINISHED_STATES,
    LEASED_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    Event,
    State,
    allowed_events,
    as_table,
    denial_reason,
    directive_for,
    transition,
)
from tests.conftest import claim, declare, start_run

ALLOWED = [(s, e, t.target) for s, edges in TRANSITIONS.items() for e, t in edges.items()]
FORBIDDEN = [(s, e) for s in State for e in Event if e not in TRANSITIONS[s]]
DIRECTIVE_WORDS = {"continue", "pause", "cancel", "wait", "stop"}


# --- the table as data --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "event", "target"), ALLOWED, ids=[f"{s}-{e}" for s, e, _ in ALLOWED]
)
def test_allowed_edge_leads_to_the_tables_target(state, event, target):
    assert transition(state, event).target == target
    assert (
        transition(state.value, event.value).target == target
    )  # plain strings from the database work too
    assert event in allowed_events(state)


@pytest.mark.parametrize(("state", "event"), FORBIDDEN, ids=[f"{s}-{e}" for s, e in FORBIDDEN])
def test_forbidden_edge_has_no_transition(state, event):
    assert transition(state, event) is None
    assert event not in allowed_events(state)


def test_the_walk_covers_every_state_event_pair():
    assert len(ALLOWED) + len(FORBIDDEN) == len(State) * len(Event)
    assert set(TRANSITIONS) == set(State)


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_terminal_states_have_no_outgoing_edges(state):
    assert TRANSITIONS[state] == {}
    assert all(transition(state, e) is None for e in Event)


def test_closed_is_the_only_terminal_state_and_every_state_can_reach_it_or_is_it():
    assert TERMINAL_STATES == {State.CLOSED}
    reachable = {State.CLOSED}
    changed = True
    while changed:  # backwards closure: states with an edge into a state that reaches CLOSED
        changed = False
        for s, edges in TRANSITIONS.items():
            if s not in reachable and any(t.target in reachable for t in edges.values()):
                reachable.add(s)
                changed = True
    assert reachable == set(State), f"states that can never be closed: {set(State) - reachable}"


def test_every_state_is_reachable_from_queued():
    seen, frontier = {State.QUEUED}, [State.QUEUED]
    while frontier:
        for t in TRANSITIONS[frontier.pop()].values():
            if t.target not in seen:
                seen.add(t.target)
                frontier.append(t.target)
    assert seen == set(State)


def test_directives_cover_every_state_with_a_known_word():
    assert set(DIRECTIVES) == set(State)
    assert set(DIRECTIVES.values()) <= DIRECTIVE_WORDS
    assert all(directive_for(s) == DIRECTIVES[s] for s in State)
    assert directive_for(State.RUNNING) == "continue"
    assert all(directive_for(s) != "continue" for s in State if s != State.RUNNING)


def test_state_sets_are_consistent_with_the_table():
    assert EFFECT_STATES <= LEASED_STATES
    assert not (LEASED_STATES & FINISHED_STATES)
    assert TERMINAL_STATES <= FINISHED_STATES
    assert denial_reason(State.RUNNING) == "not_running"  # never reached for RUNNING, but total
    assert all(denial_reason(s) == DENIAL_BY_STATE.get(s, "not_running") for s in State)
    # a pause or a cancel always stops new effects
    for s in State:
        for e in (Event.PAUSE, Event.CANCEL):
            t = transition(s, e)
            if t is not None:
                assert t.target not in EFFECT_STATES


def test_as_table_lists_exactly_the_allowed_edges():
    rows = as_table()
    assert len(rows) == len(ALLOWED)
    assert {(r["from"], r["event"], r["to"]) for r in rows} == {
        (s.value, e.value, t.value) for s, e, t in ALLOWED
    }


# --- the services refuse forbidden transitions, with 409 and an audit row -------------------------


def _force(run_id: str, *events: Event) -> None:
    """Move a run along the table the way an operator service would (interventions are built elsewhere)."""
    with transaction.atomic():
        run = lock_run(run_id)
        for event in events:
            apply_transition(run, event, actor=system_actor("test"), reason=f"test: {event.value}")


@pytest.mark.django_db
def test_apply_transition_refuses_an_edge_not_in_the_table_and_changes_nothing(worker):
    run = start_run(worker)
    before = HistoryEvent.objects.filter(run_id=run["id"]).count()
    with pytest.raises(Conflict) as err, transaction.atomic():
        apply_transition(lock_run(run["id"]), Event.FINISH_SUCCEEDED, actor=system_actor("test"))
    assert err.value.status == 409 and err.value.extra["state"] == "queued"
    assert Run.objects.get(pk=run["id"]).state == "queued"
    assert HistoryEvent.objects.filter(run_id=run["id"]).count() == before


@pytest.mark.django_db
def test_claim_on_a_succeeded_run_is_409_not_claimable_and_audited(worker):
    run = start_run(worker)
    c = claim(worker, run["id"])
    assert (
        worker.post(
            f"/runs/{run['id']}/finish",
            {"fencing_token": c["lease"]["fencing_token"], "outcome": "succeeded"},
        ).json()["state"]
        == "succeeded"
    )
    resp = worker.post(f"/runs/{run['id']}/claim", {"worker": "worker-8"})
    assert resp.status_code == 409 and resp.json()["error"] == "not_claimable"
    denied = AuditEvent.objects.get(run_id=run["id"], action="run.claim", outcome="denied")
    assert denied.reason.startswith("not_claimable") and denied.context["state"] == "succeeded"
    assert Run.objects.get(pk=run["id"]).fencing_token == 1


@pytest.mark.django_db
def test_finish_on_a_paused_run_is_409_lease_lost_and_audited(worker):
    run = start_run(worker)
    c = claim(worker, run["id"])
    _force(run["id"], Event.PAUSE)  # running -> pausing
    rel = worker.post(
        f"/leases/{c['lease']['id']}/release", {"fencing_token": 1, "reason": "paused at boundary"}
    )
    assert rel.status_code == 200 and rel.json()["state"] == "paused"
    resp = worker.post(f"/runs/{run['id']}/finish", {"fencing_token": 1, "outcome": "succeeded"})
    assert resp.status_code == 409 and resp.json()["error"] in ("lease_lost", "conflict")
    assert Run.objects.get(pk=run["id"]).state == "paused"
    assert (
        AuditEvent.objects.filter(run_id=run["id"], action="run.finish", outcome="denied").count()
        == 1
    )


@pytest.mark.django_db
def test_second_approval_request_while_awaiting_approval_is_409_and_leaves_no_trace(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    first = worker.post(
        f"/runs/{run['id']}/approvals", {"fencing_token": 1, "tool": "payments", "action": "charge"}
    )
    assert first.status_code == 201
    history = HistoryEvent.objects.filter(run_id=run["id"]).count()
    again = worker.post(
        f"/runs/{run['id']}/approvals", {"fencing_token": 1, "tool": "payments", "action": "charge"}
    )
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    assert (
        again.json()["state"] == "awaiting_approval" and again.json()["event"] == "request_approval"
    )
    # the refused decision rolled back whole: no second approval row, no history appended
    assert Approval.objects.filter(run_id=run["id"]).count() == 1
    assert HistoryEvent.objects.filter(run_id=run["id"]).count() == history
    denied = AuditEvent.objects.get(run_id=run["id"], action="approval.request", outcome="denied")
    assert "request_approval is not allowed" in denied.reason


@pytest.mark.django_db
def test_release_outside_pause_or_cancel_ends_the_lease_without_a_transition(worker):
    run = start_run(worker)
    c = claim(worker, run["id"])
    rel = worker.post(f"/leases/{c['lease']['id']}/release", {"fencing_token": 1})
    assert rel.status_code == 200 and rel.json()["state"] == "running"
    assert ExecutionLease.objects.get(pk=c["lease"]["id"]).status == "released"
    # ...and the released lease can no longer write: 409 lease_lost
    resp = worker.post(f"/runs/{run['id']}/checkpoints", {"fencing_token": 1, "step": "s"})
    assert resp.status_code == 409 and resp.json()["error"] == "lease_lost"


@pytest.mark.django_db
@pytest.mark.parametrize("stopping", [Event.PAUSE, Event.CANCEL])
def test_declaration_after_pause_or_cancel_commits_is_denied_with_the_states_reason(
    worker, stopping
):
    run = start_run(worker)
    claim(worker, run["id"])
    _force(run["id"], stopping)
    resp = declare(worker, run["id"], 1)
    expected = {Event.PAUSE: "run_paused", Event.CANCEL: "run_cancelled"}[stopping]
    assert (
        resp.status_code == 409
        and resp.json()["decision"] == "denied"
        and resp.json()["reason"] == expected
    )
    assert AuditEvent.objects.filter(
        run_id=run["id"], action="effect.declare", outcome="denied", reason=expected
    ).exists()
