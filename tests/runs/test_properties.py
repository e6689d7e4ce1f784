"""Random sequences of protocol calls (and operator moves along the table) keep the run invariants.

A hypothesis RuleBasedStateMachine drives the real services on PostgreSQL: two runs, two workers, a
small pool of idempotency keys and arguments, lease expiry, and operator events applied through
``apply_transition`` (the interventions themselves are built elsewhere). Refusals are expected --
they are ``DomainError``s -- anything else fails the test. After every step the invariants of the
issue are checked against the database, not against the machine's own bookkeeping.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from audit.models import AuditEvent
from audit.services import verify_chain
from core.actors import Actor, system_actor
from core.errors import Conflict, DomainError
from runs.models import Agent, Attempt, Effect, ExecutionLease, HistoryEvent, Run
from runs.selectors import verify_history
from runs.services import effects, lifecycle, records
from runs.services.decisions import apply_transition, lock_run
from runs.states import LEASED_STATES, TRANSITIONS, Event, State, directive_for, transition
from tests.conftest import delete_what_was_written, triggers_off

WORKERS = {
    name: Actor(kind="worker", name=name, role="worker", component="test")
    for name in ("w-a", "w-b")
}
SYSTEM = system_actor("test")
KEYS = ["charge-1", "charge-2", "reserve-1"]
TOOLS = [
    ("payments", "charge"),
    ("inventory", "reserve"),
    ("shipping", "create_label"),
]  # shipping: no grant
# Operator interventions and job outcomes; worker-protocol facts (claim, finish, lease expiry, ...)
# only ever happen through their services.
OPERATOR_EVENTS = [
    Event.PAUSE,
    Event.RESUME,
    Event.CANCEL,
    Event.TERMINATE,
    Event.RETRY,
    Event.COMPENSATE,
    Event.RECOVER,
    Event.APPROVE,
    Event.REJECT,
    Event.APPROVAL_TIMED_OUT,
    Event.CLOSE,
    Event.REVALIDATION_PASSED,
    Event.REVALIDATION_BLOCKED,
    Event.RECOVERY_REDRIVE,
    Event.REDRIVE,
    Event.REDRIVE_SETTLED,
    Event.REDRIVE_COMPENSATE_FIRST,
    Event.RECOVERY_ESCALATE,
    Event.RECOVERY_COMPENSATE,
    Event.COMPENSATION_COMPLETED,
    Event.COMPENSATION_FAILED,
    Event.JOB_FAILED,
]

run_index = st.integers(min_value=0, max_value=1)
# "holder": whoever holds the run's lease now, with the current token; w-a / w-b: that worker with the
# last lease it was given (possibly fenced out long ago), or the run's token if it never claimed.
caller = st.sampled_from(["holder", "holder", "w-a", "w-b"])


def _truncate() -> None:
    # Each example starts from empty tables. The append-only triggers refuse DELETE and TRUNCATE, so
    # the reset runs with triggers off for the session (replica mode), as a database owner could. A
    # DELETE of the tables that hold rows, not a TRUNCATE: the same empty tables, without TRUNCATE's
    # new files for each of the ~20 tables it cascades to (most of this test's time on a busy machine).
    with triggers_off(["default"]):
        delete_what_was_written()


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        _truncate()
        Agent.objects.get_or_create(
            name="purchasing",
            defaults={"allowed_scopes": ["payments:*", "inventory:*", "shipping:*"]},
        )
        self.runs: list = []
        self.leases: dict[tuple, tuple] = {}  # (run pk, worker) -> (lease id, fencing token)
        self.effects: list[tuple] = []  # (run pk, effect pk)
        self.closed: set = set()

    # --- helpers --------------------------------------------------------------------------------
    def _run(self, i: int):
        return self.runs[i % len(self.runs)]

    def _state(self, run_pk) -> str:
        return Run.objects.values_list("state", flat=True).get(pk=run_pk)

    def _as(self, run_pk, who: str) -> tuple[Actor, object, int]:
        """(actor, lease id or None, fencing token) for a caller."""
        if who == "holder":
            live = ExecutionLease.objects.filter(
                run_id=run_pk, status=ExecutionLease.ACTIVE
            ).first()
            if live is not None:
                return WORKERS[live.worker], live.pk, live.fencing_token
            who = "w-a"
        lease_id, token = self.leases.get(
            (run_pk, who), (None, Run.objects.get(pk=run_pk).fencing_token)
        )
        return WORKERS[who], lease_id, token

    # --- rules ----------------------------------------------------------------------------------
    @initialize()
    def first_run_claimed(self):
        self.create_run()
        self.claim(0, "w-a")

    @precondition(lambda self: len(self.runs) < 2)
    @rule()
    def create_run(self):
        run = lifecycle.create_run(
            actor=WORKERS["w-a"],
            agent="purchasing",
            goal="property",
            authority=[
                {"scope": "payments:charge", "ttl_s": 3600},
                {"scope": "inventory:*", "ttl_s": 3600},
            ],
        )
        self.runs.append(run.pk)

    @rule(i=run_index, worker=st.sampled_from(sorted(WORKERS)))
    def claim(self, i, worker):
        run_pk = self._run(i)
        before = self._state(run_pk)
        try:
            c = lifecycle.claim_run(actor=WORKERS[worker], run_id=run_pk, worker=worker)
        except DomainError as err:
            assert err.code in ("lease_held", "not_claimable") and before != State.QUEUED
            return
        assert before == State.QUEUED
        self.leases[(run_pk, worker)] = (c.lease.pk, c.lease.fencing_token)

    @rule(i=run_index, who=caller)
    def heartbeat(self, i, who):
        run_pk = self._run(i)
        actor, lease_id, token = self._as(run_pk, who)
        if lease_id is None:
            return
        try:
            beat = lifecycle.heartbeat(actor=actor, lease_id=lease_id, fencing_token=token)
        except DomainError as err:
            assert err.code == "lease_lost"
            return
        assert beat.directive == directive_for(self._state(run_pk))

    @rule(
        i=run_index,
        who=caller,
        key=st.sampled_from(KEYS),
        amount=st.sampled_from([1, 2]),
        tool=st.sampled_from(TOOLS),
    )
    def declare(self, i, who, key, amount, tool):
        run_pk = self._run(i)
        before = self._state(run_pk)
        actor, _, token = self._as(run_pk, who)
        try:
            result = effects.declare_effect(
                actor=actor,
                run_id=run_pk,
                fencing_token=token,
                step="s",
                tool=tool[0],
                action=tool[1],
                idempotency_key=key,
                args={"amount": amount},
            )
        except DomainError as err:
            assert err.code in ("effect_unresolved", "idempotency_key_reused")
            return
        if result.decision == "authorized":
            # After a pause (or anything but running) commits, no new effect is authorised.
            assert before == State.RUNNING
            self.effects.append((run_pk, result.effect.pk))

    @precondition(lambda self: self.effects)
    @rule(
        n=st.integers(min_value=0, max_value=50),
        who=caller,
        status=st.sampled_from(["committed", "failed", "unknown"]),
    )
    def outcome(self, n, who, status):
        run_pk, effect_pk = self.effects[n % len(self.effects)]
        actor, _, token = self._as(run_pk, who)
        run = Run.objects.get(pk=run_pk)
        previous = Effect.objects.get(pk=effect_pk).status
        try:
            effect = effects.record_outcome(
                actor=actor, effect_id=effect_pk, fencing_token=token, status=status
            )
        except Conflict:  # already committed/failed with another status: facts are not rewritten
            assert previous in ("committed", "failed") and previous != status
            return
        assert effect.status == status  # always accepted...
        if previous in Effect.UNRESOLVED and (
            token != run.fencing_token or run.state not in LEASED_STATES
        ):
            assert (
                effect.stale_lease
            )  # ...but flagged when it comes from a fenced-out or finished lease

    @rule(i=run_index, who=caller)
    def checkpoint(self, i, who):
        run_pk = self._run(i)
        actor, _, token = self._as(run_pk, who)
        try:
            records.write_checkpoint(
                actor=actor, run_id=run_pk, fencing_token=token, step="s", state={"by": actor.name}
            )
        except DomainError as err:
            assert err.code == "lease_lost"

    @rule(i=run_index, who=caller, succeeded=st.booleans())
    def finish(self, i, who, succeeded):
        run_pk = self._run(i)
        actor, _, token = self._as(run_pk, who)
        try:
            lifecycle.finish_attempt(
                actor=actor,
                run_id=run_pk,
                fencing_token=token,
                outcome="succeeded" if succeeded else "failed",
                failure_class="test",
            )
        except DomainError as err:
            assert err.code in ("lease_lost", "effects_unresolved", "conflict")

    @rule(i=run_index, who=caller)
    def request_approval(self, i, who):
        run_pk = self._run(i)
        actor, _, token = self._as(run_pk, who)
        try:
            records.request_approval(
                actor=actor, run_id=run_pk, fencing_token=token, tool="payments", action="charge"
            )
        except DomainError as err:
            assert err.code in ("lease_lost", "conflict")

    @rule(i=run_index, who=caller)
    def release(self, i, who):
        run_pk = self._run(i)
        actor, lease_id, token = self._as(run_pk, who)
        if lease_id is None:
            return
        try:
            lifecycle.release_lease(actor=actor, lease_id=lease_id, fencing_token=token)
        except DomainError as err:
            assert err.code == "lease_lost"

    @rule(i=run_index)
    def expire_lease(self, i):
        run_pk = self._run(i)
        ExecutionLease.objects.filter(run_id=run_pk, status=ExecutionLease.ACTIVE).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        lifecycle.expire_leases(actor=SYSTEM)
        assert not ExecutionLease.objects.filter(
            run_id=run_pk, status=ExecutionLease.ACTIVE
        ).exists()

    @rule(
        i=run_index,
        event=st.sampled_from(OPERATOR_EVENTS),
        any_event=st.booleans(),
        pick=st.integers(min_value=0, max_value=20),
    )
    def operator(self, i, event, any_event, pick):
        """An operator move: either one the table allows from the current state (drives runs around
        the graph), or any event at all, refused with Conflict exactly when the table has no edge."""
        run_pk = self._run(i)
        state = self._state(run_pk)
        if not any_event:
            events = [e for e in OPERATOR_EVENTS if e in TRANSITIONS[State(state)]]
            if not events:
                return
            event = events[pick % len(events)]
        allowed = transition(state, event)
        try:
            with transaction.atomic():
                apply_transition(lock_run(run_pk), event, actor=SYSTEM, reason="property test")
        except Conflict:
            assert allowed is None
            return
        assert allowed is not None and self._state(run_pk) == allowed.target

    # --- invariants (one pass, a handful of queries: they run after every step) -------------------
    @invariant()
    def run_invariants_hold(self):
        runs = {r.pk: r for r in Run.objects.filter(pk__in=self.runs)}
        leases, attempts, keys = defaultdict(list), Counter(), defaultdict(list)
        for run_id, status, token in ExecutionLease.objects.filter(
            run_id__in=self.runs
        ).values_list("run_id", "status", "fencing_token"):
            leases[run_id].append((status, token))
        for run_id in Attempt.objects.filter(run_id__in=self.runs).values_list("run_id", flat=True):
            attempts[run_id] += 1
        for run_id, key in Effect.objects.filter(
            run_id__in=self.runs, decision="authorized"
        ).values_list("run_id", "idempotency_key"):
            keys[run_id].append(key)
        changes = defaultdict(list)
        for run_id, data in (
            HistoryEvent.objects.filter(run_id__in=self.runs, kind="state_changed")
            .order_by("seq")
            .values_list("run_id", "data")
        ):
            changes[run_id].append(data)
        audited = defaultdict(list)
        for run_id, ctx in (
            AuditEvent.objects.filter(
                run_id__in=self.runs, object_type="run", context__has_key="from_state"
            )
            .order_by("seq")
            .values_list("run_id", "context")
        ):
            audited[run_id].append((ctx["from_state"], ctx["to_state"], ctx["event"]))

        for run_pk, run in runs.items():
            # terminal states stay terminal
            if run_pk in self.closed:
                assert run.state == State.CLOSED
            if run.state == State.CLOSED:
                self.closed.add(run_pk)
            # at most one live lease, only while a worker may hold one, and it carries the run's token
            active = [token for status, token in leases[run_pk] if status == ExecutionLease.ACTIVE]
            assert len(active) <= 1
            if active:
                assert run.state in LEASED_STATES and active[0] == run.fencing_token
            # every claim made one attempt and one lease and moved the fencing token on by one
            assert len(leases[run_pk]) == attempts[run_pk] == run.fencing_token == run.attempt_count
            # at most one authorised effect per idempotency key
            assert len(keys[run_pk]) == len(set(keys[run_pk]))
            # each run's history chain verifies
            assert verify_history(run)["ok"], verify_history(run)
            self._history_walks_the_table(run, changes[run_pk])
            # every state change has exactly one audit event saying the same thing
            assert audited[run_pk] == [(d["from"], d["to"], d["event"]) for d in changes[run_pk]]
        report = verify_chain()
        assert report.ok, report

    @staticmethod
    def _history_walks_the_table(run: Run, changes: list[dict]) -> None:
        """Every recorded state change is an edge of the table, contiguous from queued to the current
        state; and a succeeded run never runs again unless an operator retried it in between."""
        state, seen_succeeded, retried = State.QUEUED.value, False, False
        for data in changes:
            assert data["from"] == state
            edge = transition(data["from"], data["event"])
            assert edge is not None and edge.target == data["to"], data
            state = data["to"]
            retried = retried or (seen_succeeded and data["event"] == Event.RETRY)
            if state == State.RUNNING:
                assert not seen_succeeded or retried, "a succeeded run ran again without a retry"
            seen_succeeded = seen_succeeded or state == State.SUCCEEDED
        assert state == run.state


@pytest.mark.timeout(900)  # a failure shrinks for a while; a pass takes well under a minute
@pytest.mark.django_db(transaction=True)
def test_random_protocol_sequences_keep_the_run_invariants(postgres_only):
    run_state_machine_as_test(
        ProtocolMachine,
        # derandomize: the same sequences on every run and machine (a deterministic suite); no
        # example database written into the checkout.
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
    _truncate()


def test_operator_events_are_not_protocol_facts():
    """The machine drives protocol facts only through their services; the rest of the table is operator moves."""
    protocol = {
        Event.CLAIM,
        Event.REQUEST_APPROVAL,
        Event.FINISH_SUCCEEDED,
        Event.FINISH_FAILED,
        Event.WORKER_STOPPED,
        Event.LEASE_EXPIRED,
    }
    assert set(OPERATOR_EVENTS) | protocol == set(Event)
    assert not set(OPERATOR_EVENTS) & protocol
