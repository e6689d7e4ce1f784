"""The run state machine, as data.

One table: (state, event) -> Transition(next state, guard name). Services look transitions up here,
the contracts page and the console render it, and the tests walk every allowed and forbidden edge.
No ORM imports: this module is pure data so anything can read it.

Events are either worker-protocol facts (claim, finish, lease expiry, approval request) or operator
interventions (pause, resume, cancel, ...). Guards are named preconditions that the service checks
with the database in hand (e.g. ``no_inflight_effects``); the table only names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    QUEUED = "queued"  # claimable by a worker
    RUNNING = "running"  # a worker holds the execution lease
    AWAITING_APPROVAL = "awaiting_approval"  # planned boundary: a human decides
    PAUSING = "pausing"  # pause committed; waiting for the worker to reach a boundary
    PAUSED = "paused"  # preserved: no new progress, lease released
    REVALIDATING = "revalidating"  # resume asked; revalidation job running
    CANCELLING = "cancelling"  # cancel committed; waiting for the worker to stop
    CANCELLED = "cancelled"
    ORPHANED = "orphaned"  # lease expired without release: the worker disappeared
    RECOVERING = "recovering"  # recovery job reconciling durable state with the world
    COMPENSATING = "compensating"  # compensation plan executing
    COMPENSATED = "compensated"
    # A compensation plan ended with steps that failed for good: some committed effects are still in
    # the world and could not be undone. Not "failed": a forward retry from here would replay effects
    # that were already undone. The way on is another compensation (it skips what was undone and
    # retries the rest under fresh keys) or a deliberate close.
    COMPENSATION_FAILED = "compensation_failed"
    FAILED = "failed"
    SUCCEEDED = "succeeded"
    CLOSED = "closed"  # accountable owner closed the case; nothing more happens
    # A follow-up job (revalidation, recovery, compensation) failed JOB_MAX_ATTEMPTS times: the run is
    # handed to an operator instead of staying in the job's transient state forever.
    NEEDS_ATTENTION = "needs_attention"


class Event(StrEnum):
    # worker protocol facts
    CLAIM = "claim"
    REQUEST_APPROVAL = "request_approval"
    FINISH_SUCCEEDED = "finish_succeeded"
    FINISH_FAILED = "finish_failed"
    WORKER_STOPPED = "worker_stopped"  # worker acknowledged pause/cancel at a boundary
    LEASE_EXPIRED = "lease_expired"
    # operator interventions
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    # Stop waiting for the worker: its own contract (interventions/terminate.py), never a repeated
    # cancel. The lease ends now; what it had in flight becomes unknown until reconciled.
    TERMINATE = "terminate"
    RETRY = "retry"
    COMPENSATE = "compensate"
    RECOVER = "recover"
    APPROVE = "approve"
    REJECT = "reject"
    APPROVAL_TIMED_OUT = "approval_timed_out"
    CLOSE = "close"
    # Redrive from a chosen checkpoint (interventions/redrive.py): straight to the queue when every
    # later effect is kept, else through a compensation plan of the ones to undo first.
    REDRIVE = "redrive"
    REDRIVE_COMPENSATE_FIRST = "redrive_compensate_first"
    # job outcomes
    REVALIDATION_PASSED = "revalidation_passed"
    REVALIDATION_BLOCKED = "revalidation_blocked"
    RECOVERY_REDRIVE = "recovery_redrive"
    RECOVERY_ESCALATE = "recovery_escalate"
    RECOVERY_COMPENSATE = "recovery_compensate"
    COMPENSATION_COMPLETED = "compensation_completed"
    COMPENSATION_FAILED = "compensation_failed"
    REDRIVE_SETTLED = "redrive_settled"  # a redrive's compensate-first plan completed
    JOB_FAILED = "job_failed"  # a follow-up job gave up after JOB_MAX_ATTEMPTS


@dataclass(frozen=True)
class Transition:
    target: State
    guard: str | None = None  # name of a precondition checked by the service


S, E, T = State, Event, Transition

TRANSITIONS: dict[State, dict[Event, Transition]] = {
    S.QUEUED: {
        E.CLAIM: T(S.RUNNING),
        E.PAUSE: T(S.PAUSED),
        E.CANCEL: T(S.CANCELLED),
    },
    S.RUNNING: {
        E.PAUSE: T(S.PAUSING),
        E.CANCEL: T(S.CANCELLING),
        E.REQUEST_APPROVAL: T(S.AWAITING_APPROVAL),
        E.FINISH_SUCCEEDED: T(S.SUCCEEDED, guard="no_unresolved_effects"),
        E.FINISH_FAILED: T(S.FAILED),
        E.LEASE_EXPIRED: T(S.ORPHANED),
    },
    S.AWAITING_APPROVAL: {
        E.APPROVE: T(S.RUNNING),
        E.REJECT: T(S.RUNNING),  # the worker learns the rejection and decides how to end
        E.APPROVAL_TIMED_OUT: T(S.RUNNING),
        E.PAUSE: T(S.PAUSING),
        E.CANCEL: T(S.CANCELLING),
        E.FINISH_FAILED: T(S.FAILED),
        E.LEASE_EXPIRED: T(S.ORPHANED),
    },
    S.PAUSING: {
        E.WORKER_STOPPED: T(S.PAUSED),
        E.LEASE_EXPIRED: T(
            S.PAUSED
        ),  # the pause was the intent; unknown effects are reconciled on resume
        E.FINISH_SUCCEEDED: T(S.SUCCEEDED, guard="no_unresolved_effects"),
        E.FINISH_FAILED: T(S.FAILED),
        E.CANCEL: T(S.CANCELLING),
    },
    S.PAUSED: {
        E.RESUME: T(S.REVALIDATING),
        E.CANCEL: T(S.CANCELLED),
        E.COMPENSATE: T(S.COMPENSATING, guard="no_unresolved_effects"),
        E.REDRIVE: T(S.QUEUED, guard="no_unresolved_effects"),
        E.REDRIVE_COMPENSATE_FIRST: T(S.COMPENSATING, guard="no_unresolved_effects"),
    },
    S.REVALIDATING: {
        E.REVALIDATION_PASSED: T(S.QUEUED),
        E.REVALIDATION_BLOCKED: T(S.PAUSED),
        E.CANCEL: T(S.CANCELLED),
        E.JOB_FAILED: T(S.NEEDS_ATTENTION),
    },
    S.CANCELLING: {
        E.WORKER_STOPPED: T(S.CANCELLED),
        E.FINISH_SUCCEEDED: T(S.CANCELLED),
        E.FINISH_FAILED: T(S.CANCELLED),
        E.LEASE_EXPIRED: T(S.CANCELLED),
        # The operator's exit: stop waiting for the worker (its lease is ended now, not at expiry).
        # Its own event, so a second plain cancel has no edge here (409 naming the first).
        E.TERMINATE: T(S.CANCELLED),
    },
    S.CANCELLED: {
        E.COMPENSATE: T(S.COMPENSATING, guard="no_unresolved_effects"),
        E.REDRIVE: T(S.QUEUED, guard="no_unresolved_effects"),
        E.REDRIVE_COMPENSATE_FIRST: T(S.COMPENSATING, guard="no_unresolved_effects"),
        E.CLOSE: T(S.CLOSED),
    },
    S.ORPHANED: {
        E.RECOVER: T(S.RECOVERING),
        E.CANCEL: T(S.CANCELLED),
    },
    S.RECOVERING: {
        E.RECOVERY_REDRIVE: T(S.QUEUED),
        E.RECOVERY_ESCALATE: T(S.PAUSED),
        E.RECOVERY_COMPENSATE: T(S.COMPENSATING),
        # The operator's exit: the recovery job finds the run moved on and concludes nothing.
        E.CANCEL: T(S.CANCELLED),
        E.JOB_FAILED: T(S.NEEDS_ATTENTION),
    },
    S.COMPENSATING: {
        E.COMPENSATION_COMPLETED: T(S.COMPENSATED),
        E.REDRIVE_SETTLED: T(S.QUEUED),
        E.COMPENSATION_FAILED: T(S.COMPENSATION_FAILED),
        # The operator's exit: the plan stops before its next step (a step already called finishes
        # and is recorded); the plan ends and the run stays cancelled.
        E.CANCEL: T(S.CANCELLED),
        E.JOB_FAILED: T(S.NEEDS_ATTENTION),
    },
    S.NEEDS_ATTENTION: {
        E.PAUSE: T(S.PAUSED),
        E.CANCEL: T(S.CANCELLED),
        E.CLOSE: T(S.CLOSED),
        E.RESUME: T(S.REVALIDATING),
        E.RETRY: T(S.QUEUED, guard="previous_attempt_accounted_for"),
        E.RECOVER: T(S.RECOVERING),
        E.COMPENSATE: T(S.COMPENSATING, guard="no_unresolved_effects"),
    },
    S.COMPENSATION_FAILED: {
        E.COMPENSATE: T(S.COMPENSATING, guard="no_unresolved_effects"),
        E.CLOSE: T(S.CLOSED),
    },
    S.COMPENSATED: {
        E.CLOSE: T(S.CLOSED),
    },
    S.FAILED: {
        E.RETRY: T(S.QUEUED, guard="previous_attempt_accounted_for"),
        E.COMPENSATE: T(S.COMPENSATING, guard="no_unresolved_effects"),
        E.REDRIVE: T(S.QUEUED, guard="no_unresolved_effects"),
        E.REDRIVE_COMPENSATE_FIRST: T(S.COMPENSATING, guard="no_unresolved_effects"),
        E.CLOSE: T(S.CLOSED),
    },
    S.SUCCEEDED: {
        E.COMPENSATE: T(S.COMPENSATING, guard="no_unresolved_effects"),
        E.CLOSE: T(S.CLOSED),
    },
    S.CLOSED: {},
}

# What the lease holder is told on heartbeat, by state. The directive is derived, never stored
# separately, so it can never disagree with the state.
DIRECTIVES: dict[State, str] = {
    S.QUEUED: "stop",
    S.RUNNING: "continue",
    S.AWAITING_APPROVAL: "wait",
    S.PAUSING: "pause",
    S.PAUSED: "pause",
    S.REVALIDATING: "stop",
    S.CANCELLING: "cancel",
    S.CANCELLED: "cancel",
    S.ORPHANED: "stop",
    S.RECOVERING: "stop",
    S.COMPENSATING: "stop",
    S.COMPENSATED: "stop",
    S.COMPENSATION_FAILED: "stop",
    S.FAILED: "stop",
    S.SUCCEEDED: "stop",
    S.CLOSED: "stop",
    S.NEEDS_ATTENTION: "stop",
}

# States in which a worker holds (or may hold) the execution lease and may write facts.
LEASED_STATES = frozenset({S.RUNNING, S.AWAITING_APPROVAL, S.PAUSING, S.CANCELLING})
# States in which a new effect may be authorised. Only RUNNING: a pause or cancel committing
# removes the run from this set in the same transaction that records the intervention.
EFFECT_STATES = frozenset({S.RUNNING})
# States in which a run may hand authority to a child: it may act now (running) or will once claimed
# (queued). A paused, cancelling, orphaned or finished parent may not act, so it may not delegate
# either (runs/services/delegation.py): a child never does what its parent may not do now.
DELEGATING_STATES = frozenset({S.QUEUED, S.RUNNING})
TERMINAL_STATES = frozenset(s for s, edges in TRANSITIONS.items() if not edges)
# Execution is over (no lease, no effects) though follow-up interventions may still apply.
FINISHED_STATES = frozenset(
    {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.COMPENSATED, S.COMPENSATION_FAILED, S.CLOSED}
)

# States in which a pending approval can still be decided. Entering any other state supersedes the
# run's pending approvals (runs.services.decisions.apply_transition): the run moved on without them.
APPROVAL_LIVE_STATES = frozenset({S.AWAITING_APPROVAL, S.PAUSING})

# Statuses of an effect in the ledger (runs.models.Effect). ``discrepancy``: a late outcome
# contradicted a reconciled status; both facts are kept and an operator must look.
EFFECT_STATUSES = ("in_flight", "committed", "failed", "unknown", "discrepancy", "denied")

# Denial reason for an effect declared while the run is not running.
DENIAL_BY_STATE: dict[State, str] = {
    S.PAUSING: "run_paused",
    S.PAUSED: "run_paused",
    S.REVALIDATING: "run_paused",
    S.CANCELLING: "run_cancelled",
    S.CANCELLED: "run_cancelled",
}


def transition(state: State | str, event: Event | str) -> Transition | None:
    """The allowed transition, or None if the table has no such edge."""
    return TRANSITIONS[State(state)].get(Event(event))


def allowed_events(state: State | str) -> list[Event]:
    return list(TRANSITIONS[State(state)])


def directive_for(state: State | str) -> str:
    return DIRECTIVES[State(state)]


def denial_reason(state: State | str) -> str:
    return DENIAL_BY_STATE.get(State(state), "not_running")


def state_edges() -> list[tuple[str, str]]:
    """Every (from, to) pair of states the table allows, worker-protocol facts, interventions and job
    outcomes alike. Services move ``Run.state`` only through :data:`TRANSITIONS` (one UPDATE per edge,
    in ``apply_transition``), so these pairs are every change the database may see: the PostgreSQL
    trigger on ``runs_run.state`` (``Run.Meta.triggers``) is generated from them and refuses the rest."""
    return sorted(
        {(s.value, t.target.value) for s, edges in TRANSITIONS.items() for t in edges.values()}
    )


def as_table() -> list[dict[str, str | None]]:
    """Flat rows for the contracts page and the API."""
    return [
        {"from": s.value, "event": e.value, "to": t.target.value, "guard": t.guard}
        for s, edges in TRANSITIONS.items()
        for e, t in edges.items()
    ]
