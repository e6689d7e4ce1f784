"""Compensate: semantic repair of *committed* effects, in a deliberate order. It can fail too.

The plan is built from the ledger: committed action effects, newest first (the reverse of the order
the run performed them -- declared_at, because a reconciled outcome's outcome_at is the time it was
learned, not the time it happened); irreversible effects and effects without a usable compensation are
called out, never executed; effects already compensated are skipped. Committing the intervention
persists the plan and enqueues :func:`execute_compensation_plan` on commit.

The job is idempotent and safe to run twice or concurrently. Each step, in plan order:
  1. one transaction, plan row locked: declare the compensation as its own ledger effect (kind
     "compensation", key ``compensate:<original key>``) -- or reuse the one already declared -- and
     claim the step;
  2. no transaction: call the registered compensator with that key. A crash here leaves the effect
     in flight; whoever takes the step over calls again with the SAME key, and the external system
     replays instead of undoing twice;
  3. one transaction: record the outcome. A failure is retried with backoff (1 s, 2 s, 4 s ...) up to
     ``max_attempts``; a step that exhausts them fails and the plan goes on with the next one.
The plan ends completed, partially_failed or failed -- never silently: the run moves to compensated
or compensation_failed (not plain failed: a forward retry would replay what was undone), the
intervention's receipt gets the result, and all of it is audited.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import Actor, system_actor
from core.errors import EffectsUnresolved, Invalid
from core.roles import ADMIN, INCIDENT_COMMANDER
from interventions import cards, jobs
from interventions.base import finish_job
from interventions.models import CompensationPlan, CompensationStep, Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from interventions.registry import CompensationResult, EffectInfo, get_compensator, redact
from runs.models import Checkpoint, Effect, Run
from runs.selectors import unresolved_effects
from runs.services.decisions import apply_transition, lock_run, notify_run_changed
from runs.services.effects import fingerprint
from runs.services.history import append_history
from runs.services.lifecycle import set_resume_point
from runs.states import Event, State, transition

log = logging.getLogger(__name__)

DEFAULT_OPTIONS = {"max_attempts": 3, "backoff_s": 1.0, "claim_ttl_s": 60}
OPTION_BOUNDS = {"max_attempts": (1, 10), "backoff_s": (0, 300), "claim_ttl_s": (1, 3600)}
COMPENSATED, PENDING, FAILED = (
    "compensated",
    "pending",
    "failed",
)  # Effect.compensation_status values


# -- the plan, read from the ledger ---------------------------------------------------------------


def plan_options(raw: dict[str, Any]) -> dict[str, Any]:
    out = dict(DEFAULT_OPTIONS)
    for name, (low, high) in OPTION_BOUNDS.items():
        if name in raw:
            value = raw[name]
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not low <= value <= high
            ):
                raise Invalid(
                    f"options.{name} must be a number between {low} and {high}",
                    field=f"options.{name}",
                )
            out[name] = int(value) if name != "backoff_s" else float(value)
    return out


def compensation_key(effect: Effect) -> str:
    """``compensate:<key>``; a fresh suffix only if an earlier compensation of it *failed* for good
    (the external system stores a refusal under its key and would replay it forever)."""
    earlier = Effect.objects.filter(compensates=effect, decision=Effect.AUTHORIZED).count()
    key = f"compensate:{effect.idempotency_key}" + (f":{earlier + 1}" if earlier else "")
    return key if len(key) <= 200 else "compensate:" + hashlib.sha256(key.encode()).hexdigest()


def _why_not_executable(effect: Effect) -> str:
    if effect.irreversible:
        return "irreversible: it stays committed; nothing can undo it"
    if not effect.compensation:
        return "no compensation was declared with this effect"
    if get_compensator(effect.tool, effect.action) is None:
        return f"no compensator is registered for {effect.tool}:{effect.action}"
    return ""


def _ledger_row(e: Effect) -> dict[str, Any]:
    return {
        "effect": str(e.pk),
        "step": e.step,
        "tool": e.tool,
        "action": e.action,
        "idempotency_key": e.idempotency_key,
        "external_ref": e.external_ref,
        "declared_at": e.declared_at.isoformat(),
        "compensation_status": e.compensation_status or None,
        "discrepancy": e.discrepancy if e.status == Effect.DISCREPANCY else None,
    }


def build_plan(run: Run, only: set[str] | None = None) -> dict[str, Any]:
    """Pure read: what a compensation of this run would do now. ``only``: the effect ids a redrive
    chose to compensate first (interventions/redrive.py); the rest of the ledger is left alone."""
    # A discrepancy (the world reported committed against a reconciled failed, or the reverse) is
    # offered too: the world may hold it, and undoing it is what an operator most likely needs.
    committed = Effect.objects.filter(
        run=run,
        kind=Effect.ACTION,
        decision=Effect.AUTHORIZED,
        status__in=(Effect.COMMITTED, Effect.DISCREPANCY),
    ).order_by("-declared_at", "-outcome_at")
    if only is not None:
        committed = committed.filter(pk__in=only)
    steps: list[dict[str, Any]] = []
    called_out, skipped = [], []
    for e in committed:
        row = _ledger_row(e)
        done_elsewhere = Effect.objects.filter(compensates=e, status=Effect.COMMITTED).exists()
        if e.compensation_status == COMPENSATED or done_elsewhere:
            skipped.append(row | {"why": "already compensated"})
        elif why := _why_not_executable(e):
            called_out.append(row | {"why": why, "irreversible": e.irreversible})
        else:
            spec = e.compensation or {}  # set: _why_not_executable refuses an effect without one
            steps.append(
                row
                | {
                    "position": len(steps) + 1,
                    "compensation_key": compensation_key(e),
                    "compensation": {
                        "tool": spec.get("tool") or e.tool,
                        "action": spec.get("action", ""),
                        "args": spec.get("args") or {},
                    },
                }
            )
    return {
        "order": "reverse of the order the run performed them (newest first)",
        "steps": steps,
        "called_out": called_out,
        "skipped": skipped,
    }


def step_dict(s: CompensationStep) -> dict[str, Any]:
    e = s.effect
    return {
        "position": s.position,
        "effect": str(s.effect_id),
        "step": e.step,
        "tool": e.tool,
        "action": e.action,
        "idempotency_key": e.idempotency_key,
        "declared_at": e.declared_at.isoformat(),  # its place in the ledger (ledger_order)
        "compensation": {"tool": s.tool, "action": s.action, "args": s.args},
        "compensation_key": s.idempotency_key,
        "compensation_effect": str(s.compensation_effect_id) if s.compensation_effect_id else None,
        "status": s.status,
        "attempts": s.attempts,
        "failures": s.failures,
        "last_error": s.last_error,
        "external_ref": s.external_ref,
    }


def plan_dict(plan: CompensationPlan) -> dict[str, Any]:
    return {
        "id": str(plan.pk),
        "run_id": str(plan.run_id),
        "status": plan.status,
        "options": plan.options,
        "steps": [step_dict(s) for s in plan.steps.select_related("effect").order_by("position")],
        "called_out": plan.called_out,
        "skipped": plan.skipped,
        "result": plan.result or None,
    }


# -- the contract -----------------------------------------------------------------------------------


class CompensatePreview(TypedDict):
    """The plan a compensation would run, in order, and what blocks it."""

    plan: Row
    options: Row
    unresolved_effects: Rows
    blocked: bool
    how: str
    ends: str


class CompensateReceipt(TypedDict):
    state: str
    plan_id: str
    plan: Row
    job: Row


def preview(run: Run, req: Request, actor: Actor) -> CompensatePreview:
    unresolved = unresolved_effects(run)
    return {
        "plan": build_plan(run),
        "options": plan_options(req.options),
        "unresolved_effects": unresolved,
        "blocked": bool(unresolved),
        "how": "a Celery job runs the steps in this order; each compensation is its own ledger effect with "
        "its own idempotency key; failures are retried with backoff; called-out effects stay committed",
        "ends": "completed, partially_failed or failed -- the run then becomes compensated or "
        "compensation_failed",
    }


def require_resolved(run: Run) -> None:
    """Guard ``no_unresolved_effects``: compensating around an unknown outcome would guess."""
    unresolved = unresolved_effects(run)
    if unresolved:
        names = ", ".join(
            f"{e['tool']}:{e['action']} ({e['idempotency_key']}, {e['status']})" for e in unresolved
        )
        raise EffectsUnresolved(
            f"reconcile first: {len(unresolved)} effect(s) in flight or unknown: {names}",
            effects=unresolved,
            state=run.state,
        )


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> CompensateReceipt:
    require_resolved(run)
    options = plan_options(req.options)
    apply_transition(run, Event.COMPENSATE, actor=actor, reason=req.reason)
    plan = start_plan(run, intervention, actor, options)
    Intervention.objects.filter(pk=intervention.pk).update(status=Intervention.PENDING)
    intervention.status = Intervention.PENDING
    return {
        "state": run.state,
        "plan_id": str(plan.pk),
        "plan": plan_dict(plan),
        "job": {"status": "queued"},
    }


def start_plan(
    run: Run,
    intervention: Intervention,
    actor: Actor,
    options: dict[str, Any],
    only: set[str] | None = None,
) -> CompensationPlan:
    """Persist the plan (caller holds the run lock, in the transaction of the decision) and enqueue it."""
    built = build_plan(run, only)
    plan = CompensationPlan.objects.create(
        run=run,
        intervention=intervention,
        options=options,
        called_out=built["called_out"],
        skipped=built["skipped"],
    )
    for row in built["steps"]:
        spec = row["compensation"]
        CompensationStep.objects.create(
            plan=plan,
            position=row["position"],
            effect_id=row["effect"],
            tool=spec["tool"],
            action=spec["action"],
            args=spec["args"],
            idempotency_key=row["compensation_key"],
        )
    Effect.objects.filter(pk__in=[r["effect"] for r in built["steps"]]).update(
        compensation_status=PENDING
    )
    summary = {
        "plan": str(plan.pk),
        "steps": [f"{r['tool']}:{r['action']}" for r in built["steps"]],
        "called_out": [r["idempotency_key"] for r in built["called_out"]],
        "skipped": [r["idempotency_key"] for r in built["skipped"]],
    }
    append_history(run, "compensation_planned", summary, actor=actor)
    record_audit(
        actor=actor,
        action="compensation.plan",
        object_type="compensation_plan",
        object_id=plan.pk,
        run_id=run.pk,
        reason=intervention.reason,
        context={**summary, "options": options, "intervention": str(intervention.pk)},
    )
    # The outbox row commits with the plan; a lost message is delivered again by the job sweep.
    jobs.enqueue("compensation", plan.pk, run)
    return plan


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def _irreversible(irreversible: list[dict[str, Any]], outcome: str) -> dict[str, Any]:
    named = ", ".join(f"{c['tool']}:{c['action']} ({c['idempotency_key']})" for c in irreversible)
    return cards.answer(
        "irreversible",
        "Irreversible",
        f"{named} — {outcome}" if irreversible else "",
        empty="none",
        tone="bad" if irreversible else "",
    )


def ledger_order(plan: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The plan's steps and its called-out effects in one list, newest first as the ledger has them:
    an irreversible effect in the middle of the ledger keeps its place between the steps around it
    (the plan goes on past it), on the preview's card and on the receipt alike."""
    steps, called_out = plan.get("steps") or [], plan.get("called_out") or []
    return sorted(
        [("step", s) for s in steps] + [("out", c) for c in called_out],
        key=lambda pair: pair[1].get("declared_at", ""),
        reverse=True,
    )


def compensate_card(p: Mapping[str, Any]) -> Answers:
    plan = p.get("plan") or {}
    steps, called_out = plan.get("steps") or [], plan.get("called_out") or []
    rows = []
    for what, e in ledger_order(plan):
        if what == "step":
            comp = e.get("compensation") or {}
            rows.append(
                cards.row(
                    cards.cell("text", e["position"]),
                    cards.effect_cell(e),
                    cards.cell("code", e.get("idempotency_key")),
                    cards.cell("code", f"{comp.get('tool')}:{comp.get('action')}"),
                    cards.cell(
                        "value", redact(comp.get("tool") or "", comp.get("args") or {}), fold=True
                    ),
                    testid="plan-step",
                )
            )
        else:
            rows.append(
                cards.row(
                    cards.cell("text", "—"),
                    cards.effect_cell(e),
                    cards.cell("code", e.get("idempotency_key")),
                    cards.cell("flag", "irreversible" if e.get("irreversible") else "not undone"),
                    cards.cell("text", e.get("why", "")),
                    mark="irreversible" if e.get("irreversible") else "called-out",
                    testid="plan-called-out",
                )
            )
    irreversible = [c for c in called_out if c.get("irreversible")]
    skipped = plan.get("skipped") or []
    return [
        cards.answer(
            "plan",
            "Plan",
            f"{len(steps)} compensation{'s' if len(steps) != 1 else ''}, newest first "
            f"(the reverse of the order the run performed them)",
            cards.table(["#", "effect", "idempotency key", "undo with", "args / why not"], rows),
            empty="nothing committed to compensate",
        ),
        _irreversible(irreversible, "stays committed; nothing can undo it"),
        cards.answer(
            "skipped",
            "Already compensated",
            ", ".join(f"{c['tool']}:{c['action']}" for c in skipped),
            empty="none",
        ),
        cards.answer(
            "retries",
            "On failure",
            "each step is retried up to {max_attempts} times with backoff from {backoff_s} s; "
            "the plan ends completed, partially_failed or failed".format(
                **{"max_attempts": "?", "backoff_s": "?", **(p.get("options") or {})}
            ),
        ),
    ]


def compensate_receipt(r: Mapping[str, Any]) -> Answers:
    """The plan's table with each step's progress is the report below the card: not drawn twice."""
    plan = r.get("plan") or {}
    steps, called_out = plan.get("steps") or [], plan.get("called_out") or []
    irreversible = [c for c in called_out if c.get("irreversible")]
    order = [
        f"{e['compensation']['tool']}:{e['compensation']['action']}"
        if what == "step"
        else f"[{e['tool']}:{e['action']} {'irreversible' if e.get('irreversible') else 'not undone'}: stays committed]"
        for what, e in ledger_order(plan)
    ]
    return [
        cards.answer(
            "plan",
            "Plan",
            f"{len(steps)} compensation{'s' if len(steps) != 1 else ''} in reverse order: "
            + ", ".join(order)
            if steps
            else "",
            empty="nothing to compensate",
        ),
        _irreversible(irreversible, "stays committed"),
    ]


def compensate_blocking(p: Mapping[str, Any]) -> list[str]:
    if not p.get("blocked"):
        return []
    return [
        f"reconcile first: {len(p.get('unresolved_effects') or [])} effect(s) in flight or unknown"
    ]


CONTRACTS = (
    Contract(
        kind="compensate",
        event=Event.COMPENSATE,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="semantic repair of committed effects, in reverse order",
            stops=("the run's execution",),
            continues=("the compensation plan, executed by Celery with retries",),
            cascade="this run only",
            authority="compensations are ledger effects with their own idempotency keys",
            jobs=("execute the compensation plan; ends completed, partially_failed or failed",),
            claims=("reverse_order", "irreversible_called_out", "each_compensation_once"),
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            card=compensate_card, receipt=compensate_receipt, blocking=compensate_blocking
        ),
        order=60,
        owner_bound=True,
    ),
)


# -- the job ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepClaim:
    step_id: int
    attempt: int
    info: EffectInfo
    key: str


@shared_task(bind=True, acks_late=True)
def execute_compensation_plan(self, plan_id: str) -> dict[str, Any]:
    """Thin: drive the plan; if a step waits for its backoff, come back then (a new message). The
    job is done when the plan has ended; until then the sweep re-delivers a lost message."""
    task_id = self.request.id or ""
    outcome = jobs.perform(
        "compensation",
        plan_id,
        lambda: run_compensation_plan(plan_id, task_id=task_id),
        finished=lambda out: bool(out.get("finished")),
        come_back_in=lambda out: float(out.get("countdown") or 0),
    )
    if outcome.get("countdown") is not None:
        jobs.deliver("compensation", str(plan_id), countdown=outcome["countdown"])
    return outcome


def run_compensation_plan(plan_id: str, *, task_id: str = "") -> dict[str, Any]:
    """Run steps in order until the plan ends, a step must wait for its backoff, or another delivery
    of the job holds the current step. Re-derives everything from the database."""
    actor = system_actor("compensation")
    while True:
        claim = _claim_next_step(plan_id, task_id, actor)
        if not isinstance(claim, StepClaim):
            return claim
        result = _call_compensator(claim)  # network I/O: deliberately outside any transaction
        outcome = _record_attempt(plan_id, claim, result, actor)
        if outcome is not None:
            return outcome


def _claim_next_step(plan_id: str, task_id: str, actor: Actor) -> StepClaim | dict[str, Any]:
    with transaction.atomic(durable=True):
        plan = CompensationPlan.objects.select_for_update().get(pk=plan_id)
        if plan.status in CompensationPlan.FINAL:
            return {"status": plan.status, "finished": True}
        step = (
            plan.steps.select_related("effect")
            .filter(status__in=CompensationStep.OPEN)
            .order_by("position")
            .first()
        )
        if step is None:
            return _finish_plan(plan, actor)
        now = timezone.now()
        if Run.objects.filter(pk=plan.run_id, state=State.CANCELLED).exists():
            # An operator cancelled the compensation: no further step is called.
            why = f"not run: {State.CANCELLED.value} by an operator"
            close_open_steps(lock_run(plan.run_id), plan, why, actor, now)
            return _finish_plan(plan, actor)
        if (
            step.status == CompensationStep.RUNNING
            and step.claimed_until is not None
            and step.claimed_until > now
            and not (task_id and task_id == step.claimed_by)
        ):
            return {"status": "busy", "step": step.position, "claimed_by": step.claimed_by}
        if (
            step.status == CompensationStep.PENDING
            and step.next_attempt_at
            and step.next_attempt_at > now
        ):
            return {
                "status": "waiting",
                "step": step.position,
                "countdown": max((step.next_attempt_at - now).total_seconds(), 0.05),
            }
        run = lock_run(plan.run_id)
        comp = _declare_compensation(run, plan, step, actor, now)
        step.status, step.attempts = CompensationStep.RUNNING, step.attempts + 1
        step.claimed_by, step.claimed_until = (
            task_id,
            now + timedelta(seconds=plan.options.get("claim_ttl_s", 60)),
        )
        step.started_at = step.started_at or now
        step.save(
            update_fields=[
                "status",
                "attempts",
                "claimed_by",
                "claimed_until",
                "started_at",
                "compensation_effect",
            ]
        )
        if plan.status == CompensationPlan.PENDING:
            plan.status, plan.started_at = CompensationPlan.RUNNING, now
            append_history(run, "compensation_started", {"plan": str(plan.pk)}, actor=actor)
        plan.updated_at = now
        plan.save(update_fields=["status", "started_at", "updated_at"])
        e = step.effect
        info = EffectInfo(
            tool=e.tool,
            action=e.action,
            idempotency_key=e.idempotency_key,
            args=e.args,
            external_ref=e.external_ref,
            outcome_detail=e.outcome_detail,
            compensation=e.compensation,
        )
        return StepClaim(step.pk, step.attempts, info, comp.idempotency_key)


def _declare_compensation(
    run: Run, plan: CompensationPlan, step: CompensationStep, actor: Actor, now
) -> Effect:
    """The compensation is a ledger effect of its own, declared once; every retry reuses it (and its key)."""
    if step.compensation_effect_id:
        return Effect.objects.get(pk=step.compensation_effect_id)
    existing = Effect.objects.filter(
        run=run, idempotency_key=step.idempotency_key, decision=Effect.AUTHORIZED
    ).first()
    if existing is not None:
        step.compensation_effect = existing
        return existing
    comp = Effect.objects.create(
        run=run,
        kind=Effect.COMPENSATION,
        compensates=step.effect,
        step=f"compensate:{step.effect.step}",
        tool=step.tool,
        action=step.action,
        idempotency_key=step.idempotency_key,
        fingerprint=fingerprint(step.tool, step.action, step.args),
        args=step.args,
        decision=Effect.AUTHORIZED,
        status=Effect.IN_FLIGHT,
        declared_at=now,
    )
    step.compensation_effect = comp
    append_history(
        run,
        "effect_intent",
        {
            "effect": str(comp.pk),
            "kind": Effect.COMPENSATION,
            "step": comp.step,
            "tool": comp.tool,
            "action": comp.action,
            "idempotency_key": comp.idempotency_key,
            "compensates": str(step.effect_id),
            "plan": str(plan.pk),
        },
        actor=actor,
    )
    record_audit(
        actor=actor,
        action="effect.declare",
        object_type="effect",
        object_id=comp.pk,
        run_id=run.pk,
        context={
            "decision": "authorized",
            "kind": Effect.COMPENSATION,
            "compensates": str(step.effect_id),
            "tool": comp.tool,
            "action": comp.action,
            "idempotency_key": comp.idempotency_key,
            "plan": str(plan.pk),
            "position": step.position,
        },
    )
    return comp


def _call_compensator(claim: StepClaim) -> CompensationResult:
    fn = get_compensator(claim.info.tool, claim.info.action)
    if fn is None:
        return CompensationResult(
            ok=False,
            retryable=False,
            detail={
                "error": "no_compensator",
                "message": f"no compensator registered for {claim.info.tool}:{claim.info.action}",
            },
        )
    try:
        return fn(claim.info, claim.key)
    except (
        Exception
    ) as exc:  # an adapter bug must not kill the plan; we cannot know whether it committed
        log.exception("compensator for %s:%s raised", claim.info.tool, claim.info.action)
        return CompensationResult(
            ok=False,
            retryable=True,
            detail={"error": "compensator_raised", "message": repr(exc), "ambiguous": True},
        )


def _record_attempt(
    plan_id: str, claim: StepClaim, result: CompensationResult, actor: Actor
) -> dict[str, Any] | None:
    """None: go on with the next step. A dict: stop here (and, with a countdown, come back later)."""
    with transaction.atomic(durable=True):
        plan = CompensationPlan.objects.select_for_update().get(pk=plan_id)
        run = lock_run(plan.run_id)
        step = (
            CompensationStep.objects.select_for_update(of=("self",))
            .select_related("effect", "compensation_effect")
            .get(pk=claim.step_id)
        )
        if step.status not in CompensationStep.OPEN:
            return None  # another delivery recorded this step already
        now = timezone.now()
        plan.updated_at = now
        plan.save(update_fields=["updated_at"])
        if result.ok:  # a success is a fact about the world: record it whoever's claim it was
            _step_done(run, plan, step, result, actor, now)
            return None
        if step.status != CompensationStep.RUNNING or step.attempts != claim.attempt:
            return None  # a newer claim owns the step; its answer (same key) is the one that counts
        return _step_failed_attempt(run, plan, step, claim, result, actor, now)


def _step_done(
    run: Run,
    plan: CompensationPlan,
    step: CompensationStep,
    result: CompensationResult,
    actor: Actor,
    now,
) -> None:
    comp = step.compensation_effect
    assert comp is not None, "a claimed step has declared its compensation effect"
    comp.status, comp.outcome_at, comp.external_ref, comp.outcome_detail = (
        Effect.COMMITTED,
        now,
        result.external_ref,
        result.detail,
    )
    comp.save(update_fields=["status", "outcome_at", "external_ref", "outcome_detail"])
    Effect.objects.filter(pk=step.effect_id).update(compensation_status=COMPENSATED)
    step.status, step.finished_at, step.external_ref = (
        CompensationStep.DONE,
        now,
        result.external_ref,
    )
    step.claimed_until, step.next_attempt_at = None, None
    step.save(
        update_fields=["status", "finished_at", "external_ref", "claimed_until", "next_attempt_at"]
    )
    data = {
        "plan": str(plan.pk),
        "position": step.position,
        "effect": str(step.effect_id),
        "compensation_effect": str(comp.pk),
        "idempotency_key": comp.idempotency_key,
        "external_ref": result.external_ref,
        "attempts": step.attempts,
    }
    append_history(
        run,
        "effect_outcome",
        {
            "effect": str(comp.pk),
            "status": Effect.COMMITTED,
            "external_ref": result.external_ref,
            "kind": Effect.COMPENSATION,
        },
        actor=actor,
    )
    append_history(run, "compensation_step_done", data, actor=actor)
    record_audit(
        actor=actor,
        action="compensation.step",
        object_type="effect",
        object_id=step.effect_id,
        run_id=run.pk,
        context={**data, "status": "done"},
    )
    notify_run_changed(run)


def _step_failed_attempt(run, plan, step, claim, result, actor, now) -> dict[str, Any] | None:
    step.failures += 1
    error = {
        "attempt": claim.attempt,
        "at": now.isoformat(),
        "retryable": result.retryable,
        **result.detail,
    }
    step.last_error, step.errors = error, [*step.errors, error]
    max_attempts = int(plan.options.get("max_attempts", DEFAULT_OPTIONS["max_attempts"]))
    retry, delay = result.retryable and step.failures < max_attempts, 0.0
    data = {
        "plan": str(plan.pk),
        "position": step.position,
        "effect": str(step.effect_id),
        "idempotency_key": step.idempotency_key,
        "failures": step.failures,
        "max_attempts": max_attempts,
        "error": result.detail.get("error", "failed"),
        "retryable": result.retryable,
    }
    if retry:
        delay = float(plan.options.get("backoff_s", DEFAULT_OPTIONS["backoff_s"])) * 2 ** (
            step.failures - 1
        )
        step.status, step.next_attempt_at, step.claimed_until = (
            CompensationStep.PENDING,
            now + timedelta(seconds=delay),
            None,
        )
        data["retry_in_s"] = delay
    else:
        step.status, step.finished_at, step.claimed_until = CompensationStep.FAILED, now, None
        _compensation_failed_for_good(run, step, result, actor, now)
    step.save(
        update_fields=[
            "failures",
            "last_error",
            "errors",
            "status",
            "next_attempt_at",
            "claimed_until",
            "finished_at",
        ]
    )
    kind = "compensation_attempt_failed" if retry else "compensation_step_failed"
    append_history(run, kind, data, actor=actor)
    record_audit(
        actor=actor,
        action=f"compensation.{'attempt_failed' if retry else 'step_failed'}",
        object_type="effect",
        object_id=step.effect_id,
        run_id=run.pk,
        outcome=AuditEvent.ERROR,
        reason=str(result.detail.get("message", "")),
        context={**data, "detail": result.detail},
    )
    notify_run_changed(run)
    return (
        {"status": "retry_scheduled", "step": step.position, "countdown": delay}
        if retry and delay > 0
        else None
    )


def _compensation_failed_for_good(
    run: Run, step: CompensationStep, result: CompensationResult, actor: Actor, now
) -> None:
    # A failure we could not see the end of (no answer) may have committed: record it unknown, so the
    # guard blocks another plan until it is reconciled, instead of risking a second undo.
    comp = step.compensation_effect
    assert comp is not None, "a claimed step has declared its compensation effect"
    comp.status = Effect.UNKNOWN if result.detail.get("ambiguous") else Effect.FAILED
    comp.outcome_at, comp.outcome_detail = now, {**result.detail, "failures": step.failures}
    comp.save(update_fields=["status", "outcome_at", "outcome_detail"])
    Effect.objects.filter(pk=step.effect_id).update(compensation_status=FAILED)
    # Every ledger status change has its history event (runs.integrity checks the ledger against it).
    append_history(
        run,
        "effect_outcome",
        {"effect": str(comp.pk), "status": comp.status, "kind": Effect.COMPENSATION},
        actor=actor,
    )


def close_open_steps(run: Run, plan: CompensationPlan, why: str, actor: Actor, now) -> None:
    """End the plan's open steps ``failed`` (plan and run locked by the caller). A compensation
    already called may have committed: its effect becomes unknown, so a new plan waits for
    reconciliation."""
    for step in plan.steps.select_related("compensation_effect").filter(
        status__in=CompensationStep.OPEN
    ):
        comp = step.compensation_effect
        if comp is not None and comp.status == Effect.IN_FLIGHT:
            comp.status, comp.outcome_at = Effect.UNKNOWN, now
            comp.outcome_detail = {"error": "not_heard", "message": why}
            comp.save(update_fields=["status", "outcome_at", "outcome_detail"])
            append_history(  # every ledger status change has its history event (runs.integrity)
                run,
                "effect_outcome",
                {"effect": str(comp.pk), "status": comp.status, "kind": Effect.COMPENSATION},
                actor=actor,
            )
        step.status, step.finished_at, step.claimed_until = CompensationStep.FAILED, now, None
        step.last_error = {"error": "closed", "message": why, "at": now.isoformat()}
        step.save(update_fields=["status", "finished_at", "claimed_until", "last_error"])
        Effect.objects.filter(pk=step.effect_id).update(compensation_status=FAILED)


def give_up_plan(job) -> None:
    """The compensation job failed JOB_MAX_ATTEMPTS times: the plan ends failed with the error, and
    the run is handed to an operator (interventions.jobs moves it to needs_attention)."""
    plan = CompensationPlan.objects.select_for_update().filter(pk=job.target_id).first()
    if plan is None or plan.status in CompensationPlan.FINAL:
        return
    now = timezone.now()
    why = f"the compensation job gave up after {job.failures} failure(s): {job.last_error}"
    close_open_steps(lock_run(plan.run_id), plan, why, system_actor("jobs"), now)
    plan.status, plan.finished_at, plan.updated_at = CompensationPlan.FAILED, now, now
    plan.result = {"plan_status": plan.status, "summary": why, "gave_up": True}
    plan.save(update_fields=["status", "finished_at", "updated_at", "result"])
    intervention = Intervention.objects.select_for_update().get(pk=plan.intervention_id)
    result = {"plan_status": plan.status, "summary": why, "plan": plan_dict(plan)}
    if intervention.kind == "compensate" and intervention.status == Intervention.PENDING:
        finish_job(intervention, Intervention.FAILED, result)
    else:
        intervention.receipt = {**intervention.receipt, "compensation": result}
        intervention.save(update_fields=["receipt"])


def _finish_plan(plan: CompensationPlan, actor: Actor) -> dict[str, Any]:
    """Every step is done or failed: name the ending, move the run, answer on the receipt."""
    steps = list(plan.steps.select_related("effect").order_by("position"))
    done = [s for s in steps if s.status == CompensationStep.DONE]
    failed = [s for s in steps if s.status == CompensationStep.FAILED]
    status = (
        CompensationPlan.COMPLETED
        if not failed
        else CompensationPlan.FAILED
        if not done
        else CompensationPlan.PARTIALLY_FAILED
    )
    now = timezone.now()
    summary = (
        f"compensation {status}: {len(done)} of {len(steps)} step(s) done, {len(failed)} failed, "
        f"{len(plan.called_out)} called out (not executed), {len(plan.skipped)} skipped"
    )
    plan.status, plan.finished_at, plan.updated_at = status, now, now
    plan.result = {
        "plan_status": status,
        "summary": summary,
        "done": len(done),
        "failed": len(failed),
        "failed_steps": [step_dict(s) for s in failed],
        "called_out": plan.called_out,
    }
    plan.save(update_fields=["status", "finished_at", "updated_at", "result"])
    run = lock_run(plan.run_id)
    intervention = Intervention.objects.select_for_update().get(pk=plan.intervention_id)
    redrive = intervention.kind == "redrive"
    event = (
        (Event.REDRIVE_SETTLED if redrive else Event.COMPENSATION_COMPLETED)
        if status == CompensationPlan.COMPLETED
        else Event.COMPENSATION_FAILED
    )
    append_history(
        run,
        "compensation_finished",
        {"plan": str(plan.pk), "status": status, "summary": summary},
        actor=actor,
    )
    if transition(run.state, event) is not None:
        if event == Event.REDRIVE_SETTLED:  # the new attempt starts from the chosen checkpoint
            set_resume_point(run, redrive_checkpoint(intervention), claimable_after=None)
        apply_transition(
            run,
            event,
            actor=actor,
            reason=summary,
            data={"plan": str(plan.pk), "plan_status": status},
        )
    record_audit(
        actor=actor,
        action="compensation.plan_finished",
        object_type="compensation_plan",
        object_id=plan.pk,
        run_id=run.pk,
        reason=summary,
        outcome=AuditEvent.ALLOWED if not failed else AuditEvent.ERROR,
        context={
            "plan_status": status,
            "run_state": run.state,
            "failed": [s.idempotency_key for s in failed],
        },
    )
    result = {"plan_status": status, "summary": summary, "plan": plan_dict(plan)}
    if redrive:
        result["redrive"] = (
            "queued from the checkpoint" if not failed else "not started: " + summary
        )
    if intervention.kind in ("compensate", "redrive"):
        finish_job(
            intervention, Intervention.COMPLETED if not failed else Intervention.FAILED, result
        )
    else:  # a recovery chose to compensate: its own job result stays; the plan's is added beside it
        intervention.receipt = {**intervention.receipt, "compensation": result}
        intervention.save(update_fields=["receipt"])
    return {"status": status, "finished": True, "summary": summary}


def redrive_checkpoint(intervention: Intervention) -> Checkpoint | None:
    seq = (intervention.receipt or {}).get("checkpoint", {}).get("seq")
    return Checkpoint.objects.filter(run_id=intervention.run_id, seq=seq).first()


jobs.register_kind("compensation", execute_compensation_plan, give_up_plan)
