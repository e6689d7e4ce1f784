"""Every non-terminal state has an operator exit.

Over the transition table (runs/states.py) and the permission matrix (core/roles.py): from every
state a run can reach -- by any mix of worker facts, job outcomes and interventions -- an incident
commander may issue cancel, terminate (a cancelling run: stop waiting for the worker) or close, and
by interventions alone (no worker, no job, no guard to
satisfy) can drive the run to ``closed``. The last test issues that exit through the real service for
a run put in each non-terminal state, so the contract modules agree with the table.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.roles import INCIDENT_COMMANDER, may
from interventions.plugins import REGISTRY
from runs.states import TERMINAL_STATES, TRANSITIONS, Event, State, transition

IC = frozenset({INCIDENT_COMMANDER})
# The events an operator issues: those of a registered intervention contract.
OPERATOR_EVENTS = frozenset(c.event for c in REGISTRY.values() if c.event is not None)
EXITS = (Event.CANCEL, Event.TERMINATE, Event.CLOSE)
NON_TERMINAL = sorted(set(State) - TERMINAL_STATES)


def ic_exits(state: State) -> list[Event]:
    return [e for e in EXITS if transition(state, e) is not None and may(IC, e.value)]


def ic_path_to_closed(state: State) -> list[Event] | None:
    """Breadth-first over unguarded edges an incident commander may issue: the shortest way out."""
    paths, frontier = {state: []}, [state]
    while frontier:
        here = frontier.pop(0)
        if here == State.CLOSED:
            return paths[here]
        for event, edge in TRANSITIONS[here].items():
            if event not in OPERATOR_EVENTS or edge.guard or not may(IC, event.value):
                continue
            if edge.target not in paths:
                paths[edge.target] = [*paths[here], event]
                frontier.append(edge.target)
    return None


def test_the_operator_events_are_the_contracts_events():
    assert {Event.PAUSE, Event.RESUME, Event.CANCEL, Event.CLOSE, Event.RECOVER} <= OPERATOR_EVENTS
    assert Event.JOB_FAILED not in OPERATOR_EVENTS and Event.CLAIM not in OPERATOR_EVENTS


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_every_non_terminal_state_offers_cancel_or_close_to_an_incident_commander(state):
    assert ic_exits(state), f"{state}: no cancel or close an incident commander may issue"
    assert ic_path_to_closed(state) is not None, f"{state}: interventions alone never close it"


@st.composite
def walks(draw):
    """A run's life: any edge of the table at each step (worker, job or operator), from queued."""
    state, taken = State.QUEUED, []
    for _ in range(draw(st.integers(0, 25))):
        edges = sorted(TRANSITIONS[state].items())
        if not edges:
            break
        event, edge = draw(st.sampled_from(edges))
        taken.append(event)
        state = edge.target
    return state, taken


@settings(max_examples=400, deadline=None)
@given(walks())
def test_wherever_a_run_goes_an_incident_commander_can_end_it(walk):
    state, taken = walk
    if state in TERMINAL_STATES:
        return
    path = ic_path_to_closed(state)
    assert ic_exits(state) and path, f"trapped in {state} after {[e.value for e in taken]}"
    assert path[0] in EXITS  # the first step out is a cancel, a terminate or a close


def test_a_job_that_gives_up_leaves_the_run_where_an_operator_can_act():
    for edges in TRANSITIONS.values():
        if Event.JOB_FAILED in edges:
            target = edges[Event.JOB_FAILED].target
            assert target == State.NEEDS_ATTENTION
            assert {
                Event.PAUSE,
                Event.CANCEL,
                Event.CLOSE,
                Event.RESUME,
                Event.RECOVER,
            } <= set(TRANSITIONS[target])
    # every state a follow-up job waits in can hand the run over
    for waiting in (State.REVALIDATING, State.RECOVERING, State.COMPENSATING):
        assert transition(waiting, Event.JOB_FAILED) is not None


@pytest.mark.django_db
@pytest.mark.parametrize("state", NON_TERMINAL)
def test_the_exit_is_honoured_by_the_services(state, worker, as_user):
    """Put a run in each non-terminal state and walk the incident commander's way out through the
    real intervention service: every step answers 2xx and the run ends closed."""
    from runs.models import Run
    from tests.conftest import place_run_in, start_run
    from tests.interventions.helpers import intervene

    run = start_run(worker)
    place_run_in(run["id"], state.value)
    ian = as_user("ian")
    for event in ic_path_to_closed(state):
        resp = intervene(ian, run["id"], event.value, reason=f"exit from {state.value}")
        assert resp.status_code in (200, 201, 202), (state, event, resp.content)
    assert Run.objects.get(pk=run["id"]).state == State.CLOSED


@pytest.mark.django_db
def test_a_second_cancel_is_refused_and_terminate_stops_waiting_for_the_worker(worker, as_user):
    from runs.models import ExecutionLease, Run
    from tests.conftest import claim, start_run
    from tests.interventions.helpers import intervene

    run = start_run(worker)
    lease = claim(worker, run["id"])["lease"]
    ian = as_user("ian")
    first = intervene(ian, run["id"], "cancel")
    assert first.status_code == 202
    assert Run.objects.get(pk=run["id"]).state == State.CANCELLING  # waiting for the worker
    assert ExecutionLease.objects.get(run_id=run["id"]).status == "active"

    # A second plain cancel never forces: 409, naming the cancel under way.
    resp = intervene(ian, run["id"], "cancel", reason="the worker does not answer")
    assert resp.status_code == 409, resp.content
    assert resp.json()["existing_cancel"]["intervention"] == first.json()["id"]
    assert "terminate" in resp.json()["detail"]
    assert Run.objects.get(pk=run["id"]).state == State.CANCELLING
    assert ExecutionLease.objects.get(run_id=run["id"]).status == "active"

    resp = intervene(ian, run["id"], "terminate", reason="the worker does not answer")
    assert resp.status_code == 202, resp.content
    assert Run.objects.get(pk=run["id"]).state == State.CANCELLED
    ended = ExecutionLease.objects.get(run_id=run["id"])
    assert ended.status == "expired" and "terminated by" in ended.end_reason
    # the worker's next heartbeat learns it no longer holds the run
    beat = worker.post(
        f"/leases/{lease['id']}/heartbeat", {"fencing_token": lease["fencing_token"]}
    )
    assert beat.status_code == 409 and beat.json()["error"] == "lease_lost", beat.content
