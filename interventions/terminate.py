"""Terminate: stop waiting for the worker of a cancelling run. Its own contract, never a repeated
cancel (a second plain cancel is refused: interventions/cancel.py): the execution lease ends now
instead of at its expiry, the worker's later writes are fenced out, and every effect it had in
flight becomes ``unknown`` -- it may or may not have reached the world, and those must be reconciled
before anything is compensated or retried. The preview names each of them. An incident commander's
decision (or an admin's), owner-bound like cancel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from django.utils import timezone

from core.actors import Actor
from core.roles import ADMIN, INCIDENT_COMMANDER
from interventions import cards, facts
from interventions.cancel import CancelUnderWay, cancel_facts, under_way
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Rows, Spec
from runs.models import ExecutionLease, Run
from runs.services.decisions import apply_transition
from runs.services.stopping import stop_waiting
from runs.states import Event, State

UNKNOWN_NOTE = "becomes unknown: reconcile it before compensating or retrying"


def _lease(run: Run) -> dict[str, Any] | None:
    lease = ExecutionLease.objects.filter(run=run, status=ExecutionLease.ACTIVE).first()
    if lease is None:
        return None
    return {"worker": lease.worker, "fencing_token": lease.fencing_token}


def blocked_by(run: Run) -> list[str]:
    if run.state != State.CANCELLING:
        return [f"terminate applies to a cancelling run (this one is {run.state}): cancel it first"]
    return []


class TerminatePreview(TypedDict):
    stops: str
    cancel_under_way: CancelUnderWay
    lease: dict[str, Any] | None
    become_unknown: Rows
    committed_effects: Rows
    blocked_by: list[str]
    note: str


class TerminateReceipt(TypedDict):
    state: str
    terminated_at: str
    cancel_under_way: CancelUnderWay
    leases_ended: list[str]
    became_unknown: Rows
    must_reconcile: list[str]
    committed_effects: Rows


def preview(run: Run, req: Request, actor: Actor) -> TerminatePreview:
    return {
        "stops": "waiting for the worker: its lease ends now and its later writes are refused",
        "cancel_under_way": cancel_facts(under_way(run)),
        "lease": _lease(run),
        "become_unknown": [e | {"note": UNKNOWN_NOTE} for e in facts.in_flight_effects(run)],
        "committed_effects": facts.committed_effects(run),
        "blocked_by": blocked_by(run),
        "note": "committed effects remain committed; unknown ones need a reconcile first",
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> TerminateReceipt:
    cancel = cancel_facts(under_way(run))
    apply_transition(run, Event.TERMINATE, actor=actor, reason=req.reason)
    stopped = stop_waiting(run, actor, req.reason)
    return {
        "state": run.state,
        "terminated_at": timezone.now().isoformat(),
        "cancel_under_way": cancel,
        "leases_ended": stopped["leases_ended"],
        "became_unknown": stopped["became_unknown"],
        "must_reconcile": [e["effect"] for e in stopped["became_unknown"]],
        "committed_effects": facts.committed_effects(run),
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def _cancel_line(c: Mapping[str, Any] | None) -> str:
    if not c or not c.get("intervention"):
        return "no cancel intervention on record"
    return f"cancel by {c.get('issued_by')} at {c.get('at')}: {c.get('reason')}"


def terminate_card(p: Mapping[str, Any]) -> Answers:
    lease = p.get("lease") or {}
    return [
        cards.answer("stops", "What stops", p.get("stops", "")),
        cards.answer("waiting_for", "Cancel under way", _cancel_line(p.get("cancel_under_way"))),
        cards.answer(
            "lease",
            "Lease ended",
            f"{lease.get('worker')} (fencing token {lease.get('fencing_token')})"
            if lease
            else "no live lease",
        ),
        cards.answer(
            "become_unknown",
            "Becomes unknown",
            UNKNOWN_NOTE,
            cards.in_flight_table(p.get("become_unknown") or []),
            empty="nothing in flight: nothing becomes unknown",
        ),
        cards.answer(
            "committed",
            "Stays committed",
            p.get("note", ""),
            cards.committed_table(p.get("committed_effects") or []),
            empty="nothing committed yet",
        ),
    ]


def terminate_receipt(r: Mapping[str, Any]) -> Answers:
    return [
        cards.answer(
            "stops",
            "Stopped waiting",
            f"{len(r.get('leases_ended') or [])} lease(s) ended ·",
            at=r.get("terminated_at"),
        ),
        cards.answer("waiting_for", "Cancel it ended", _cancel_line(r.get("cancel_under_way"))),
        cards.answer(
            "become_unknown",
            "Now unknown (reconcile)",
            UNKNOWN_NOTE,
            cards.in_flight_table(r.get("became_unknown") or []),
            empty="nothing was in flight",
        ),
        cards.answer(
            "committed",
            "Still committed",
            "terminate never marks them undone; compensate to repair them",
            cards.committed_table(r.get("committed_effects") or []),
            empty="nothing had committed",
        ),
    ]


def terminate_blocking(p: Mapping[str, Any]) -> list[str]:
    return list(p.get("blocked_by") or [])


CONTRACTS = (
    Contract(
        kind="terminate",
        event=Event.TERMINATE,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="stop waiting for the worker of a cancelling run",
            stops=(
                "waiting for the worker: its execution lease ends now, not at expiry",
                "the worker's later writes (fenced out: lease_lost)",
            ),
            continues=(
                "an outcome the worker still reports is recorded (late, stale lease)",
                "committed effects stay committed",
            ),
            cascade="this run only",
            authority="unchanged",
            claims=("in_flight_become_unknown", "never_a_repeated_cancel"),
            preconditions=("the run is cancelling (a cancel is under way)",),
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            card=terminate_card,
            receipt=terminate_receipt,
            blocking=terminate_blocking,
            danger=True,
        ),
        order=35,
        owner_bound=True,
    ),
)
