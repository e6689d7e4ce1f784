"""Pause preserves the run: it stops *new* progress. From the commit on no new effect of the run is
authorised (declare_effect sees the state under the same row lock); in-flight work may finish and its
outcome is recorded; timers, deadlines, signals and messages keep being recorded. Authority stays
active unless the operator also suspends it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from django.utils import timezone

from core.actors import Actor
from core.roles import ADMIN, INCIDENT_COMMANDER, OPERATOR, SECURITY_RESPONDER
from interventions import cards, cascade, facts
from interventions.base import children_in_scope
from interventions.models import Intervention
from interventions.paging import (
    children_link,
    ledger_link,
    page_size,
    paged,
    receipt_children_link,
)
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from runs.models import AuthorityGrant, Effect, ExecutionLease, Run
from runs.services.decisions import apply_transition
from runs.services.history import append_history
from runs.services.lifecycle import end_lease
from runs.states import Event, State, transition


class PausePreview(TypedDict):
    """What confirming a pause would do (the preview card reads these keys)."""

    stops: str
    in_flight_effects: Rows
    in_flight_effects_total: int
    continues: list[str]
    timers: Rows
    deadline: Row | None
    children: Rows
    children_total: int
    children_more: str | None
    authority: Rows
    authority_change: str
    resume_from: Row | None


class PauseReceipt(TypedDict):
    """What the pause did, as decided (the receipt reads these keys)."""

    state: str
    paused_at: str
    new_effects: str
    in_flight_effects: Rows
    in_flight_effects_total: int
    children: Rows
    children_listed: Rows
    children_total: int
    children_more: str | None
    cascade: cascade.CascadeProgress | None
    authority: Rows
    authority_suspended: list[str]
    timers: Rows
    resume_from: Row | None
    waiting_for: str | None


def preview(run: Run, req: Request, actor: Actor) -> PausePreview:
    suspend = bool(req.options.get("suspend_authority"))
    shown: dict[str, Any] = {
        "stops": "no new effect is authorised and no new step should start, from the moment the pause commits",
        **paged(
            "in_flight_effects", facts.in_flight_effects(run), ledger_link(run.pk, "in_flight")
        ),
        "continues": [
            "in-flight effects may complete; their outcomes are recorded",
            "timers and deadlines keep running",
            "signals and operator messages are recorded",
        ],
        "timers": facts.timers(run),
        "deadline": facts.deadline(run),
        **paged("children", children_in_scope(run, req, Event.PAUSE), children_link(run.pk)),
        "authority": facts.active_grants(run),
        "authority_change": "grants will be suspended"
        if suspend
        else "none: grants stay active until they expire",
        "resume_from": facts.resume_point(run),
    }
    return cast(PausePreview, shown)


def _pause_one(
    run: Run, req: Request, actor: Actor, via: dict[str, Any] | None = None
) -> dict[str, Any]:
    in_flight = Effect.objects.filter(
        run=run, decision=Effect.AUTHORIZED, status=Effect.IN_FLIGHT
    ).exists()
    data = {"scope": req.scope, **(via or {})}
    apply_transition(run, Event.PAUSE, actor=actor, reason=req.reason, data=data)
    if run.state == State.PAUSING and not in_flight:
        # Nothing dispatched: there is no boundary to wait for, so the pause completes now and the
        # lease is released; the worker's next heartbeat reads directive "pause".
        lease = ExecutionLease.objects.filter(run=run, status=ExecutionLease.ACTIVE).first()
        if lease is not None:
            end_lease(lease, ExecutionLease.RELEASED, "paused: nothing in flight", timezone.now())
        apply_transition(
            run, Event.WORKER_STOPPED, actor=actor, reason="nothing in flight: paused at once"
        )
    suspended = []
    if req.options.get("suspend_authority"):
        for grant in AuthorityGrant.objects.filter(run=run, status=AuthorityGrant.ACTIVE):
            grant.status, grant.changed_at, grant.changed_by, grant.change_reason = (
                AuthorityGrant.SUSPENDED,
                timezone.now(),
                actor.label,
                req.reason,
            )
            grant.save(update_fields=["status", "changed_at", "changed_by", "change_reason"])
            suspended.append(grant.scope)
        append_history(
            run, "authority_suspended", {"scopes": suspended, "reason": req.reason}, actor=actor
        )
    return {"run_id": str(run.pk), "state": run.state, "suspended": suspended}


def _pause_child(child: Run, req: Request, actor: Actor, via: dict[str, Any]) -> str | None:
    """The cascade's step (interventions/cascade.py): the child is locked."""
    if transition(child.state, Event.PAUSE) is None:
        return f"pause does not apply to a {child.state} run"
    _pause_one(child, req, actor, via)
    return None


cascade.register_step("pause", _pause_child)


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> PauseReceipt:
    in_flight = facts.in_flight_effects(run)
    # Listed as they stood at the decision: after the cascade every child in scope reads "paused",
    # and "pause does not apply to a paused run" would hide that this pause reached it.
    listed = children_in_scope(run, req, Event.PAUSE)
    result = _pause_one(run, req, actor)
    # A tree's children are reached by the cascade: the first few here, the rest in its job.
    progress = cascade.start(run, req, actor, intervention) if req.scope == "tree" else None
    more = receipt_children_link(intervention.pk)
    shown: dict[str, Any] = {
        "state": run.state,
        "paused_at": timezone.now().isoformat(),
        "new_effects": "denied from this commit on",
        **paged("in_flight_effects", in_flight, ledger_link(run.pk, "in_flight")),
        **paged("children", listed, more),
        "children_listed": listed[: page_size()],
        "cascade": progress,
        "authority": facts.active_grants(run),
        "authority_suspended": result["suspended"],
        "timers": facts.timers(run),
        "resume_from": facts.resume_point(run),
        "waiting_for": "the worker to stop at a step boundary"
        if run.state == State.PAUSING
        else None,
    }
    return cast(PauseReceipt, shown)


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def pause_card(p: Mapping[str, Any]) -> Answers:
    in_flight = p.get("in_flight_effects") or []
    n_in_flight = p.get("in_flight_effects_total") or len(in_flight)
    timers = p.get("timers") or []
    deadline = p.get("deadline")
    timer_rows = [
        cards.row(
            cards.cell("code", t["name"]),
            cards.timer_cell(t),
            cards.cell("status", t["status"]),
        )
        for t in timers
    ]
    if deadline:
        timer_rows.append(
            cards.row(
                cards.cell("text", "run deadline"),
                cards.cell("time", deadline["deadline"]),
                cards.cell("text", ""),
            )
        )
    return [
        cards.answer("stops", "What stops", p.get("stops", "")),
        cards.answer(
            "may_still_complete",
            "May still complete",
            f"{n_in_flight} effect{'s' if n_in_flight != 1 else ''} already dispatched; "
            "outcomes are recorded after the pause"
            if in_flight
            else "",
            cards.in_flight_table(in_flight),
            empty="nothing in flight: the pause completes at once",
        ),
        cards.children_answer(
            p,
            "children",
            "the pause reaches them" if p.get("scope") == "tree" else "this run only",
        ),
        cards.answer(
            "authority",
            "Authority",
            p.get("authority_change", ""),
            cards.grants_table(p.get("authority") or []),
        ),
        cards.answer(
            "timers",
            "Timers keep running",
            "",
            cards.table(["timer", "fires", "status"], timer_rows),
            empty="no pending timer or deadline",
        ),
        cards.answer(
            "resume_from", "A resume starts from", cards.checkpoint_text(p.get("resume_from"))
        ),
    ]


def pause_receipt(r: Mapping[str, Any]) -> Answers:
    timers = r.get("timers") or []
    suspended = r.get("authority_suspended") or []
    return [
        cards.answer(
            "stops", "New effects", f"{r.get('new_effects', 'denied')} ·", at=r.get("paused_at")
        ),
        cards.answer(
            "may_still_complete",
            "May still complete",
            "its outcome is recorded after the pause" if r.get("in_flight_effects") else "",
            cards.in_flight_table(r.get("in_flight_effects") or []),
            empty="nothing was in flight",
        ),
        cards.children_answer(r, "children_listed"),
        cards.answer(
            "authority",
            "Authority still active",
            ("suspended: " + ", ".join(suspended)) if suspended else "",
            cards.grants_table(r.get("authority") or []),
            empty="no active grant",
        ),
        cards.answer(
            "timers",
            "Timers keep running",
            "",
            cards.table(
                ["timer", "fires", "status"],
                [
                    cards.row(
                        cards.cell("code", t["name"]),
                        cards.timer_cell(t),
                        cards.cell("status", t["status"]),
                    )
                    for t in timers
                ],
            ),
            empty="no pending timer",
        ),
        cards.answer(
            "resume_from", "A resume starts from", cards.checkpoint_text(r.get("resume_from"))
        ),
    ]


def pause_now(r: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """ "Paused — drained at 23:14:05 UTC: payments:charge committed 2 s after the pause"."""
    return cards.stopped_now(now, "pause", "pausing", "paused")


CONTRACTS = (
    Contract(
        kind="pause",
        event=Event.PAUSE,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="preserves the run: stops new progress",
            stops=(
                "authorisation of new effects, from the commit on",
                "new steps (directive 'pause')",
            ),
            continues=(
                "in-flight effects may complete; outcomes are recorded (flagged late)",
                "timers fire and are recorded",
                "deadlines keep running",
                "signals and operator messages are recorded",
            ),
            cascade="operator's choice: scope 'run' or 'tree'; children are listed either way",
            authority="unchanged by default (receipt lists active grants and expiry); option suspend_authority",
            claims=(
                "new_effects_denied_after_commit",
                "inflight_outcome_recorded",
                "timers_continue",
                "children_listed",
            ),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
        console=Console(
            card=pause_card,
            receipt=pause_receipt,
            now=pause_now,
            fields=("suspend_authority",),
            danger=True,
        ),
        order=10,
        scoped=True,
    ),
)
