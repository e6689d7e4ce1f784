"""Reconciliation: settle an effect whose outcome is not known, from evidence.

Either an operator records what they found (with evidence), or a registered reconciler asks the
external system by idempotency key. Retry, resume and recovery refuse to proceed past an unknown
effect; this is how it becomes known.

Unknown stays unknown until it is known: "the system never saw this key" is not "failed" -- a frozen
worker may still send the call. ``failed`` is concluded from not-seen only when the world can no
longer commit the key: the effect's lease is fenced *and* the adapter's by-key void confirmed, or the
provider's documented commit window (``registry.commit_window``) has passed since the declaration.
An operator may also settle a ``discrepancy`` (a late outcome contradicting a reconciliation) with
evidence; it needs the same role and decision authority as the reconcile intervention.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from celery import shared_task
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor, system_actor
from core.errors import Conflict, Forbidden, Invalid, NotFound
from core.roles import (
    ADMIN,
    INCIDENT_COMMANDER,
    OPERATOR,
    may,
)
from interventions import cards, jobs
from interventions.base import authorize
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from interventions.registry import (
    ReconcileResult,
    get_commit_window,
    get_key_voider,
    get_reconciler,
)
from runs.models import Effect, ExecutionLease, Run
from runs.selectors import unresolved_effects
from runs.services.decisions import decision, lock_run, notify_run_changed
from runs.services.effects import effect_run_id
from runs.services.history import append_history
from runs.states import LEASED_STATES
from runs.team_scope import may_know


def reconcile_effect(
    *,
    actor: Actor,
    effect_id: Any,
    outcome: str,
    evidence: Any,
    external_ref: str = "",
    reason: str = "",
    source: str = "operator",
    override_reason: str = "",
) -> Effect:
    if outcome not in (Effect.COMMITTED, Effect.FAILED):
        raise Invalid("outcome must be committed or failed", field="outcome")
    if actor.kind == "user" and not may(actor.roles, "reconcile"):
        raise Forbidden("your role may not reconcile effects")
    if actor.is_worker:
        raise Forbidden(
            "workers report outcomes; reconciliation is an operator's or the control plane's"
        )
    run_id = effect_run_id(effect_id)
    with decision(actor, "effect.reconcile", "effect", effect_id, run_id):
        run = lock_run(run_id)
        if not may_know(actor, run):  # another team's run: as absent (docs/operator/teams.md)
            raise NotFound(f"effect {effect_id} does not exist", object="effect")
        override = {"override": False}
        if actor.kind == "user":  # exactly the reconcile intervention's role + decision authority
            override = authorize(
                actor,
                run,
                Request(kind="reconcile", reason=reason, override_reason=override_reason),
            )
        effect = Effect.objects.select_for_update().get(pk=effect_id)
        settles_discrepancy = effect.status == Effect.DISCREPANCY and source == "operator"
        if not effect.unresolved and not settles_discrepancy:
            raise Conflict(
                f"effect is already {effect.status}; only in_flight or unknown effects (or a "
                "discrepancy, by an operator) are reconciled",
                status=effect.status,
            )
        if (
            effect.status == Effect.IN_FLIGHT
            and run.state in LEASED_STATES
            and source == "operator"
        ):
            raise Conflict(
                "the worker still holds the lease and may report this outcome; pause or wait first",
                state=run.state,
            )
        before = effect.status
        effect.status, effect.reconciled, effect.outcome_at = outcome, True, timezone.now()
        effect.external_ref = external_ref or effect.external_ref
        effect.reconciliation = {
            "outcome": outcome,
            "evidence": evidence,
            "by": actor.label,
            "source": source,
            "reason": reason,
            "at": timezone.now().isoformat(),
            "was": before,
        }
        effect.save(
            update_fields=["status", "reconciled", "outcome_at", "external_ref", "reconciliation"]
        )
        append_history(
            run,
            "effect_reconciled",
            {"effect": str(effect.pk), "was": before, "now": outcome, "source": source},
            actor=actor,
        )
        record_audit(
            actor=actor,
            action="effect.reconcile",
            object_type="effect",
            object_id=effect.pk,
            run_id=run.pk,
            reason=reason,
            context={
                "was": before,
                "now": outcome,
                "evidence": evidence,
                "source": source,
                "idempotency_key": effect.idempotency_key,
                "unresolved_effects": unresolved_effects(run),
                **override,
            },
        )
        notify_run_changed(run)
    return effect


def auto_reconcile(effect_id: Any, actor: Actor | None = None) -> dict[str, Any]:
    """Ask the external system by idempotency key (network: outside any transaction), then record."""
    actor = actor or system_actor("reconciler")
    effect = Effect.objects.get(pk=effect_id)
    if not effect.unresolved:
        return {"effect": str(effect.pk), "outcome": effect.status, "already": True}
    reconciler = get_reconciler(effect.tool)
    if reconciler is None:
        return {
            "effect": str(effect.pk),
            "outcome": "unknown",
            "why": f"no reconciler registered for {effect.tool}",
        }
    answer = reconciler(effect.tool, effect.action, effect.idempotency_key)
    if answer.outcome == "not_found":
        answer = _settle_not_found(effect, answer)
    if answer.outcome in ("unknown", "not_found"):
        return {
            "effect": str(effect.pk),
            "outcome": "unknown",
            "why": answer.evidence.get("why") or "the external system could not answer",
            "evidence": answer.evidence,
        }
    outcome = Effect.COMMITTED if answer.outcome == "committed" else Effect.FAILED
    evidence = {
        "asked": f"{effect.tool} by idempotency key {effect.idempotency_key}",
        "answer": answer.outcome,
        **answer.evidence,
    }
    try:
        reconcile_effect(
            actor=actor,
            effect_id=effect.pk,
            outcome=outcome,
            evidence=evidence,
            external_ref=answer.external_ref,
            reason="reconciled with the external system",
            source="reconciler",
        )
    except Conflict as err:  # someone settled it meanwhile; report what is recorded now
        return {
            "effect": str(effect.pk),
            "outcome": Effect.objects.get(pk=effect.pk).status,
            "already": True,
            "detail": err.detail,
        }
    return {
        "effect": str(effect.pk),
        "outcome": outcome,
        "evidence": evidence,
        "external_ref": answer.external_ref,
    }


def lease_fenced(effect: Effect) -> bool:
    """Can the worker that declared ``effect`` still write as the run's lease holder? Fencing tokens
    only grow, so once this is True it stays True."""
    run = Run.objects.get(pk=effect.run_id)
    if run.fencing_token != effect.fencing_token or run.state not in LEASED_STATES:
        return True
    lease = ExecutionLease.objects.filter(run=run, fencing_token=effect.fencing_token).first()
    return lease is None or not lease.is_live()


def _settle_not_found(effect: Effect, answer: ReconcileResult) -> ReconcileResult:
    """ "Never seen" becomes ``failed`` only if the world can no longer commit the key; else unknown."""
    seen = {"not_found": answer.evidence}
    window = get_commit_window(effect.tool)
    if window is not None:
        passed = (timezone.now() - effect.declared_at).total_seconds()
        if passed > window:
            return ReconcileResult(
                "failed", evidence={**seen, "commit_window_s": window, "elapsed_s": round(passed)}
            )
    # A compensation's key is reused by every retry of its plan step: voiding it would make the
    # compensation impossible. Its plan settles it by retrying under the same key.
    if effect.kind == Effect.COMPENSATION:
        why = "not seen by the external system; the compensation plan retries this key"
        return ReconcileResult("unknown", evidence={**seen, "why": why})
    voider = get_key_voider(effect.tool)
    if voider is not None and lease_fenced(effect):
        voided = voider(effect.tool, effect.action, effect.idempotency_key)
        if voided.outcome != "unknown":
            return ReconcileResult(
                voided.outcome,
                external_ref=voided.external_ref,
                evidence={**seen, "lease_fenced": True, "void": voided.evidence},
            )
        seen["void"] = voided.evidence
    blockers = [
        "no by-key void is registered"
        if voider is None
        else ("the void by key got no answer" if "void" in seen else "the worker's lease is live"),
    ]
    if window is not None:
        blockers.append(f"the {window:g} s commit window has not passed")
    why = "not seen by the external system, but it may still commit the key: " + "; ".join(blockers)
    return ReconcileResult("unknown", evidence={**seen, "why": why})


@shared_task(acks_late=True)
def reconcile_run_effects(intervention_id: str) -> dict[str, Any]:
    """The job behind a "reconcile" intervention: ask the world about every unresolved effect."""
    return jobs.perform("reconcile", intervention_id, lambda: _reconcile_all(intervention_id))


def _reconcile_all(intervention_id: str) -> dict[str, Any]:
    from django.db import transaction

    from interventions.base import finish_job

    intervention = Intervention.objects.get(pk=intervention_id)
    if intervention.status != Intervention.PENDING:
        return {"skipped": "already concluded"}
    results = [
        auto_reconcile(e.pk)
        for e in Effect.objects.filter(run_id=intervention.run_id).unresolved()
        if not (
            e.status == Effect.IN_FLIGHT and Run.objects.get(pk=e.run_id).state in LEASED_STATES
        )
    ]
    still = [r for r in results if r["outcome"] == "unknown"]
    with transaction.atomic(durable=True):
        locked = Intervention.objects.select_for_update().get(pk=intervention_id)
        if locked.status != Intervention.PENDING:  # a concurrent delivery concluded it first
            return {"skipped": "already concluded"}
        finish_job(
            locked,
            Intervention.COMPLETED if not still else Intervention.FAILED,
            {"reconciled": results, "still_unknown": len(still)},
        )
    return {"results": results}


class ReconcilePreview(TypedDict):
    unresolved_effects: Rows
    how: str


class ReconcileReceipt(TypedDict):
    unresolved_effects: Rows
    job: Row


def preview(run: Run, req: Request, actor: Actor) -> ReconcilePreview:
    return {
        "unresolved_effects": unresolved_effects(run),
        "how": "each registered reconciler is asked by idempotency key; answers are recorded as evidence",
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> ReconcileReceipt:
    Intervention.objects.filter(pk=intervention.pk).update(status=Intervention.PENDING)
    intervention.status = Intervention.PENDING
    job = jobs.enqueue("reconcile", intervention.pk, run)
    return {
        "unresolved_effects": unresolved_effects(run),
        "job": {"status": "queued", "id": str(job.pk)},
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def reconcile_card(p: Mapping[str, Any]) -> Answers:
    return [
        cards.answer(
            "to_reconcile",
            "Asked of the world",
            p.get("how", ""),
            cards.unresolved_table(p.get("unresolved_effects") or []),
        ),
    ]


def _answer_text(x: Mapping[str, Any]) -> str:
    """One answer of the world in words: why it is still unknown, or what the evidence said."""
    if x.get("why"):
        return str(x["why"])
    if x.get("already"):
        return "already settled before the job asked"
    evidence = x.get("evidence") or {}
    said = evidence.get("answer") or evidence.get("source") or ""
    return f"the world answered {said}" if said else ""


def reconcile_now(r: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    job = now.get("job") or {}
    results = job.get("reconciled")
    if now.get("status") == "pending" or results is None:
        n = len(r.get("unresolved_effects") or [])
        return f"Asking the world about {n} effect{'s' if n != 1 else ''} by idempotency key"
    if not results:
        return "Completed — nothing was left to ask: every effect's outcome was already known"
    still = int(job.get("still_unknown") or 0)
    known = len(results) - still
    line = f"{'Completed' if not still else 'Finished'} — {known} of {len(results)} settled"
    return line + (f"; {still} still unknown: reconcile by hand or try again" if still else "")


def reconcile_receipt(r: Mapping[str, Any]) -> Answers:
    job = r.get("job") or {}
    results = job.get("reconciled") or []
    return [
        cards.answer(
            "asked",
            "Asked of the world",
            "",
            cards.unresolved_table(r.get("unresolved_effects") or []),
            empty="nothing was unresolved",
        ),
        cards.answer(
            "answers",
            "Answers",
            f"{job.get('still_unknown')} still unknown" if results else "",
            cards.table(
                ["effect", "outcome", "external ref", "what the world said"],
                [
                    cards.row(
                        cards.cell("id", x.get("effect")),
                        cards.cell("status", x.get("outcome")),
                        cards.cell("text", x.get("external_ref") or "—"),
                        cards.cell("text", _answer_text(x)),
                    )
                    for x in results
                ],
            ),
            empty="nothing needed asking"
            if "job" in r and "reconciled" in job
            else "waiting for the job",
        ),
    ]


CONTRACTS = (
    Contract(
        kind="reconcile",
        event=None,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="settle effects of unknown outcome from the external system's answer or evidence",
            stops=(),
            continues=("everything",),
            cascade="this run only",
            authority="unchanged",
            jobs=(
                "ask each registered reconciler by idempotency key; 'never seen' is failed only once the "
                "lease is fenced and the key voided by the adapter, or the commit window passed",
            ),
            claims=(
                "evidence_recorded",
                "unknown_until_known",
                "late_contradiction_is_discrepancy",
            ),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            offered=lambda data: bool(data["unresolved_effects"]),
            card=reconcile_card,
            receipt=reconcile_receipt,
            now=reconcile_now,
        ),
        order=50,
        owner_bound=True,
    ),
)
jobs.register_kind("reconcile", reconcile_run_effects, jobs.give_up_intervention)
