"""Redrive from a chosen checkpoint: a failed, cancelled or paused run runs again from an earlier
checkpoint (``options.checkpoint_seq``; default the latest). What the run did after that checkpoint
is still in the world: the preview lists, from the ledger, every effect committed after it with its
compensation, whether it is reversible, and what its step's repeat will do under which idempotency
key. Per effect the operator keeps it (its step's repeat replays the recorded result: not dispatched
again) or compensates it first (``options.compensate_first``: effect ids).

Nothing to compensate first: the run is queued from the checkpoint in the decision's transaction.
Otherwise the run enters ``compensating`` with a compensation plan of exactly those effects
(interventions/compensate.py, the same job, keys and retries); only once the plan completes does the
run become claimable from the checkpoint (``redrive_settled``). A plan that ends with a failed step
leaves the run ``compensation_failed``: the new attempt does not start on an unsettled world.
A compensated effect is not replayed: its step declares it again under a new key
(runs/services/effects.py refuses the old one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from core.actors import Actor
from core.errors import Conflict, Invalid
from core.roles import ADMIN, INCIDENT_COMMANDER, OPERATOR
from interventions import cards, facts
from interventions.compensate import _why_not_executable, compensation_key, plan_options, start_plan
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from runs.models import Checkpoint, Effect, Run
from runs.selectors import checkpoint_summary, unresolved_effects
from runs.services.decisions import apply_transition
from runs.services.lifecycle import set_resume_point
from runs.states import Event, State

REDRIVABLE = (State.FAILED, State.CANCELLED, State.PAUSED)


class RedrivePreview(TypedDict):
    redrive_from: Row | None
    checkpoints: Rows
    committed_after: Rows  # every effect committed after the checkpoint, with the choice made
    compensate_first: Rows
    re_executes: Rows
    starts: str
    blocked_by: list[str]


class RedriveReceipt(TypedDict):
    state: str
    checkpoint: Row
    kept: list[str]
    compensate_first: list[str]
    starts: str
    plan_id: NotRequired[str]
    job: NotRequired[Row]


def _after(run: Run, cp: Checkpoint | None):
    effects = Effect.objects.filter(
        run=run, kind=Effect.ACTION, decision=Effect.AUTHORIZED, status=Effect.COMMITTED
    )
    return effects.filter(declared_at__gt=cp.created_at) if cp else effects


def _choices(req: Request) -> set[str]:
    raw = req.options.get("compensate_first") or []
    if not isinstance(raw, list):
        raise Invalid(
            "options.compensate_first must list effect ids", field="options.compensate_first"
        )
    return {str(x) for x in raw}


def ledger_after(run: Run, cp: Checkpoint | None, first: set[str]) -> list[dict[str, Any]]:
    """Every effect committed after the checkpoint, oldest first, with the operator's choice."""
    rows = []
    for e in _after(run, cp).order_by("declared_at"):
        why_not = "" if e.compensation_status != "compensated" else "already compensated"
        why_not = why_not or _why_not_executable(e)
        choice = "compensate_first" if str(e.pk) in first else "keep"
        rows.append(
            {
                "id": str(e.pk),
                "step": e.step,
                "tool": e.tool,
                "action": e.action,
                "idempotency_key": e.idempotency_key,
                "external_ref": e.external_ref,
                "compensation": None if e.irreversible else e.compensation,
                "reversible": not why_not,
                "why_not": why_not,
                "choice": choice,
                "compensation_key": compensation_key(e) if choice == "compensate_first" else None,
                "re_execution": (
                    f"undone first under {compensation_key(e)}; its step then declares it again "
                    f"under a new key ({e.idempotency_key} is refused once compensated)"
                    if choice == "compensate_first"
                    else f"stays committed; its step's repeat replays the recorded result under "
                    f"{e.idempotency_key}: not dispatched again"
                ),
            }
        )
    return rows


def problems(
    run: Run, cp: Checkpoint | None, ledger: list[dict[str, Any]], first: set[str]
) -> list[str]:
    out = []
    if run.state not in REDRIVABLE:
        out.append(f"only a failed, cancelled or paused run is redriven; this one is {run.state}")
    unresolved = unresolved_effects(run)
    if unresolved:
        out.append(f"reconcile first: {len(unresolved)} effect(s) in flight or unknown")
    known = {row["id"]: row for row in ledger}
    for effect_id in sorted(first):
        row = known.get(effect_id)
        if row is None:
            out.append(f"effect {effect_id} is not an effect committed after the checkpoint")
        elif not row["reversible"]:
            out.append(
                f"{row['tool']}:{row['action']} ({row['idempotency_key']}) cannot be compensated: {row['why_not']}"
            )
    return out


def preview(run: Run, req: Request, actor: Actor) -> RedrivePreview:
    cp = facts.chosen_checkpoint(run, req.options)
    first = _choices(req)
    ledger = ledger_after(run, cp, first)
    return {
        "redrive_from": checkpoint_summary(cp),
        "checkpoints": [
            {"seq": c.seq, "step": c.step, "at": c.created_at.isoformat()}
            for c in Checkpoint.objects.filter(run=run).order_by("seq")
        ],
        "committed_after": ledger,
        "compensate_first": [row for row in ledger if row["choice"] == "compensate_first"],
        "re_executes": facts.re_executes(run, cp),
        "starts": (
            "queued from the checkpoint once the compensation plan completes; a failed step "
            "leaves the run compensation_failed and no attempt starts"
            if first
            else "queued from the checkpoint on confirm"
        ),
        "blocked_by": problems(run, cp, ledger, first),
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> RedriveReceipt:
    cp = facts.chosen_checkpoint(run, req.options)
    first = _choices(req)
    ledger = ledger_after(run, cp, first)
    blocked = problems(run, cp, ledger, first)
    if blocked:
        raise Conflict(blocked[0], state=run.state)
    checkpoint = checkpoint_summary(cp) or {"seq": None}
    kept = [row["idempotency_key"] for row in ledger if row["choice"] == "keep"]
    undo = [row["idempotency_key"] for row in ledger if row["choice"] == "compensate_first"]
    receipt: dict[str, Any] = {"checkpoint": checkpoint, "kept": kept, "compensate_first": undo}
    if not first:
        set_resume_point(run, cp, claimable_after=None)
        apply_transition(run, Event.REDRIVE, actor=actor, reason=req.reason, data=receipt)
        return {
            "state": run.state,
            "checkpoint": checkpoint,
            "kept": kept,
            "compensate_first": undo,
            "starts": "queued from the checkpoint now",
        }
    apply_transition(
        run, Event.REDRIVE_COMPENSATE_FIRST, actor=actor, reason=req.reason, data=receipt
    )
    # The plan's finish reads the checkpoint from the receipt: written before the job can run.
    Intervention.objects.filter(pk=intervention.pk).update(
        status=Intervention.PENDING, receipt=receipt
    )
    intervention.status, intervention.receipt = Intervention.PENDING, receipt
    plan = start_plan(run, intervention, actor, plan_options(req.options), only=first)
    return {
        "state": run.state,
        "checkpoint": checkpoint,
        "kept": kept,
        "compensate_first": undo,
        "plan_id": str(plan.pk),
        "starts": "queued from the checkpoint once the compensation plan completes",
        "job": {"status": "queued"},
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def _ledger_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return cards.table(
        ["effect", "idempotency key", "undo with", "choice", "what happens"],
        [
            cards.row(
                cards.effect_cell(r),
                cards.cell("code", r.get("idempotency_key")),
                cards.cell(
                    "text",
                    f"{(r.get('compensation') or {}).get('tool')}:{(r.get('compensation') or {}).get('action')}"
                    if r.get("reversible")
                    else r.get("why_not", ""),
                ),
                cards.cell("flag", r.get("choice")),
                cards.cell("text", r.get("re_execution")),
                mark="" if r.get("reversible") else "irreversible",
            )
            for r in rows
        ],
    )


def redrive_card(p: Mapping[str, Any]) -> Answers:
    return [
        cards.answer("from", "Runs again from", cards.checkpoint_text(p.get("redrive_from"))),
        cards.answer(
            "committed_after",
            "Committed after it",
            "each effect below is kept (replayed, not dispatched again) or compensated first",
            _ledger_table(p.get("committed_after") or []),
            empty="nothing committed after this checkpoint",
        ),
        cards.answer("starts", "The new attempt", p.get("starts", "")),
    ]


def redrive_receipt(r: Mapping[str, Any]) -> Answers:
    return [
        cards.answer("from", "Runs again from", cards.checkpoint_text(r.get("checkpoint"))),
        cards.answer("kept", "Kept", ", ".join(r.get("kept") or []), empty="none"),
        cards.answer(
            "compensate_first",
            "Compensated first",
            ", ".join(r.get("compensate_first") or []),
            empty="none",
        ),
        cards.answer("starts", "The new attempt", r.get("starts", "")),
    ]


def redrive_blocking(p: Mapping[str, Any]) -> list[str]:
    return list(p.get("blocked_by") or [])


CONTRACTS = (
    Contract(
        kind="redrive",
        event=Event.REDRIVE,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="run again from a chosen checkpoint, settling each later effect first: keep or compensate",
            stops=("nothing runs until the chosen effects are compensated",),
            continues=(
                "the run, from the chosen checkpoint",
                "kept effects stay committed; their steps' repeats replay the recorded results",
            ),
            cascade="this run only",
            authority="checked at the next declarations, not changed",
            jobs=(
                "compensation of the effects chosen compensate-first (the compensate contract's plan)",
            ),
            claims=("starts_only_after_settled",),
            preconditions=("no effect in flight or unknown",),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            card=redrive_card,
            receipt=redrive_receipt,
            blocking=redrive_blocking,
            fields=("checkpoint_seq", "compensate_first"),
        ),
        order=45,
        owner_bound=True,
    ),
)
