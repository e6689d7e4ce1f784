"""The effect ledger: declare before dispatch, record the outcome after. The hot path of the protocol."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from audit.chain import canonical
from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import Actor
from core.errors import (
    Conflict,
    EffectUnresolved,
    IdempotencyKeyReused,
    Invalid,
    LeaseLost,
    NotFound,
)
from core.rows import select_row, select_rows
from runs.models import Approval, AuthorityGrant, Effect, Run
from runs.states import EFFECT_STATES, State, denial_reason

from .approvals import approval_denial
from .common import append_history, decision, lock_run
from .discrepancy import record_discrepancy, reported_again
from .freeze import capability_frozen
from .lifecycle import check_fencing

OUTCOMES = (Effect.COMMITTED, Effect.FAILED, Effect.UNKNOWN)


def fingerprint(tool: str, action: str, args: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({"tool": tool, "action": action, "args": args})).hexdigest()


@dataclass
class Declaration:
    effect: Effect
    decision: str  # authorized | replayed | denied

    def as_dict(self) -> dict[str, Any]:
        return effect_dict(self.effect) | {"decision": self.decision}


def effect_dict(e: Effect) -> dict[str, Any]:
    return {
        "id": str(e.id),
        "run_id": str(e.run_id),
        "attempt_id": str(e.attempt_id) if e.attempt_id else None,
        "kind": e.kind,
        "step": e.step,
        "tool": e.tool,
        "action": e.action,
        "idempotency_key": e.idempotency_key,
        "fingerprint": e.fingerprint,
        "args": e.args,
        "decision": e.decision,
        "reason": e.denial_reason or None,
        "status": e.status,
        "compensation": e.compensation,
        "irreversible": e.irreversible,
        "compensation_status": e.compensation_status or None,
        "external_ref": e.external_ref,
        "outcome_detail": e.outcome_detail,
        "declared_at": e.declared_at.isoformat(),
        "outcome_at": e.outcome_at.isoformat() if e.outcome_at else None,
        "late": e.late,
        "stale_lease": e.stale_lease,
        "reconciled": e.reconciled,
        "reconciliation": e.reconciliation,
        "discrepancy": e.discrepancy,
        "compensates": str(e.compensates_id) if e.compensates_id else None,
    }


def _authority_denial(run: Run, tool: str, action: str, now) -> str | None:
    """None if an active grant (and its whole delegation chain) covers tool:action, else the reason."""
    statuses = []
    # A delegated grant's source (and its source) load lazily: only child runs have any.
    for grant in select_rows(AuthorityGrant, run=run.pk):
        if not grant.covers(tool, action):
            continue
        status, source = grant.effective_status(now), grant.delegated_from
        while source is not None and status == AuthorityGrant.ACTIVE:
            status, source = source.effective_status(now), source.delegated_from
        if status == AuthorityGrant.ACTIVE:
            return None
        statuses.append(status)
    for status in (AuthorityGrant.REVOKED, AuthorityGrant.SUSPENDED, AuthorityGrant.EXPIRED):
        if status in statuses:
            return f"authority_{status}"
    return "authority_missing"


def declare_effect(
    *,
    actor: Actor,
    run_id: Any,
    fencing_token: int,
    step: str,
    tool: str,
    action: str,
    idempotency_key: str,
    args: dict | None = None,
    compensation: dict | None = None,
    irreversible: bool = False,
    approval_id: Any = None,
) -> Declaration:
    args = args or {}
    if not idempotency_key:
        raise Invalid("idempotency_key is required", field="idempotency_key")
    fp = fingerprint(tool, action, args)
    with decision(actor, "effect.declare", "run", run_id, run_id):
        run = lock_run(run_id)
        now = timezone.now()
        try:
            check_fencing(run, fencing_token, now)
        except LeaseLost as lost:
            return _deny(
                run,
                actor,
                "lease_lost",
                lost.detail,
                step,
                tool,
                action,
                idempotency_key,
                fp,
                args,
                fencing_token,
            )
        existing = select_row(
            Effect, run=run.pk, idempotency_key=idempotency_key, decision=Effect.AUTHORIZED
        )
        if existing is not None:
            return _replay(run, actor, existing, fp)
        reason = None if run.state in EFFECT_STATES else denial_reason(run.state)
        reason = reason or _authority_denial(run, tool, action, now)
        approval, detail = None, ""
        if reason is None:
            reason, detail = capability_frozen(run.pk, tool, action)
        if reason is None:
            reason, approval, detail = approval_denial(run, approval_id, tool, action, args)
        if reason is not None:
            return _deny(
                run,
                actor,
                reason,
                detail,
                step,
                tool,
                action,
                idempotency_key,
                fp,
                args,
                fencing_token,
            )
        effect = Effect.objects.create(
            run=run,
            attempt_id=run.current_attempt_id,
            step=step,
            tool=tool,
            action=action,
            idempotency_key=idempotency_key,
            fingerprint=fp,
            args=args,
            fencing_token=fencing_token,
            decision=Effect.AUTHORIZED,
            status=Effect.IN_FLIGHT,
            compensation=compensation,
            irreversible=irreversible,
            declared_at=now,
        )
        if approval is not None:  # single use: the compare-and-swap makes a second consumer lose
            used = Approval.objects.filter(pk=approval.pk, consumed_by__isnull=True).update(
                consumed_by=effect
            )
            if used != 1:
                raise Conflict("the approval was used by another declaration meanwhile")
        append_history(
            run,
            "effect_intent",
            {
                "effect": str(effect.pk),
                "step": step,
                "tool": tool,
                "action": action,
                "idempotency_key": idempotency_key,
            },
            attempt=run.current_attempt_id,
            actor=actor,
        )
        record_audit(
            actor=actor,
            action="effect.declare",
            object_type="effect",
            object_id=effect.pk,
            run_id=run.pk,
            context={
                "decision": "authorized",
                "state": run.state,
                "tool": tool,
                "action": action,
                "idempotency_key": idempotency_key,
                "fencing_token": fencing_token,
                "attempt": str(run.current_attempt_id),
                "approval": str(approval.pk) if approval else None,
            },
        )
    return Declaration(effect, "authorized")


def _replay(run: Run, actor: Actor, existing: Effect, fp: str) -> Declaration:
    if existing.fingerprint != fp:
        raise IdempotencyKeyReused(
            f"idempotency key {existing.idempotency_key!r} was already used for different arguments",
            idempotency_key=existing.idempotency_key,
            effect_id=str(existing.pk),
        )
    if existing.unresolved:
        raise EffectUnresolved(
            f"effect {existing.pk} with key {existing.idempotency_key!r} is {existing.status}: do not dispatch "
            "again until its outcome is recorded or reconciled",
            effect_id=str(existing.pk),
            status=existing.status,
        )
    record_audit(
        actor=actor,
        action="effect.declare",
        object_type="effect",
        object_id=existing.pk,
        run_id=run.pk,
        context={
            "decision": "replayed",
            "status": existing.status,
            "idempotency_key": existing.idempotency_key,
        },
    )
    return Declaration(existing, "replayed")


def _deny(
    run, actor, reason, detail, step, tool, action, key, fp, args, fencing_token
) -> Declaration:
    """Denied declarations are part of the ledger too (committed, not rolled back)."""
    effect = Effect.objects.create(
        run=run,
        attempt_id=run.current_attempt_id,
        step=step,
        tool=tool,
        action=action,
        idempotency_key=key,
        fingerprint=fp,
        args=args,
        fencing_token=fencing_token,
        decision=Effect.DENIED,
        status=Effect.DENIED,
        denial_reason=reason,
    )
    append_history(
        run,
        "effect_denied",
        {
            "effect": str(effect.pk),
            "tool": tool,
            "action": action,
            "idempotency_key": key,
            "reason": reason,
        },
        attempt=run.current_attempt_id,
        actor=actor,
    )
    record_audit(
        actor=actor,
        action="effect.declare",
        object_type="effect",
        object_id=effect.pk,
        run_id=run.pk,
        outcome=AuditEvent.DENIED,
        reason=reason,
        context={
            "decision": "denied",
            "reason": reason,
            "detail": detail,
            "state": run.state,
            "tool": tool,
            "action": action,
            "idempotency_key": key,
            "fencing_token": fencing_token,
        },
    )
    return Declaration(effect, "denied")


def effect_run_id(effect_id: Any) -> Any:
    """The run an effect belongs to, read before locking that run (every effect decision does)."""
    try:
        return Effect.objects.values_list("run_id", flat=True).get(pk=effect_id)
    except (Effect.DoesNotExist, ValueError):
        raise NotFound(f"effect {effect_id} does not exist", object="effect") from None


def record_outcome(
    *,
    actor: Actor,
    effect_id: Any,
    fencing_token: int | None,
    status: str,
    external_ref: str = "",
    detail: dict | None = None,
    run_id: Any = None,
) -> Effect:
    """Always accepted: an outcome is a fact about the world, even after pause/cancel or fencing.
    ``run_id``: the effect's run if the caller already looked it up with ``effect_run_id`` (the API edge
    does, to check the token's scope); an effect never moves to another run."""
    if status not in OUTCOMES:
        raise Invalid("status must be committed, failed or unknown", field="status")
    run_id = run_id if run_id is not None else effect_run_id(effect_id)
    with decision(actor, "effect.outcome", "effect", effect_id, run_id):
        run = lock_run(run_id)
        effect = select_row(Effect, pk=effect_id, lock=True)
        if effect is None:
            raise NotFound(f"effect {effect_id} does not exist", object="effect")
        if effect.decision != Effect.AUTHORIZED:
            raise Conflict(
                "a denied declaration has no outcome: nothing was dispatched", status=effect.status
            )
        now = timezone.now()
        if effect.status in (Effect.COMMITTED, Effect.FAILED, Effect.DISCREPANCY):
            if effect.status == status and (
                not external_ref or external_ref == effect.external_ref
            ):
                return effect  # the same report twice (e.g. an SDK retry)
            if effect.reconciled and (
                status == Effect.UNKNOWN or reported_again(effect, status, external_ref)
            ):
                return effect  # no news against what is already settled or already contradicted
            if effect.reconciled and effect.status != Effect.DISCREPANCY:
                return record_discrepancy(
                    run,
                    effect,
                    actor=actor,
                    status=status,
                    external_ref=external_ref,
                    detail=detail,
                    fencing_token=fencing_token,
                    now=now,
                )
            raise Conflict(f"effect already recorded as {effect.status}", status=effect.status)
        effect.stale_lease = (
            fencing_token is None
            or fencing_token != run.fencing_token
            or run.state
            not in (State.RUNNING, State.AWAITING_APPROVAL, State.PAUSING, State.CANCELLING)
        )
        effect.late = run.state != State.RUNNING and run.state != State.AWAITING_APPROVAL
        effect.status, effect.outcome_at = status, now
        effect.external_ref = external_ref or effect.external_ref
        effect.outcome_detail = detail or {}
        effect.save(
            update_fields=[
                "status",
                "outcome_at",
                "external_ref",
                "outcome_detail",
                "late",
                "stale_lease",
            ]
        )
        append_history(
            run,
            "effect_outcome",
            {
                "effect": str(effect.pk),
                "status": status,
                "external_ref": effect.external_ref,
                "late": effect.late,
                "stale_lease": effect.stale_lease,
            },
            attempt=run.current_attempt_id,
            actor=actor,
        )
        record_audit(
            actor=actor,
            action="effect.outcome",
            object_type="effect",
            object_id=effect.pk,
            run_id=run.pk,
            context={
                "status": status,
                "external_ref": effect.external_ref,
                "late": effect.late,
                "stale_lease": effect.stale_lease,
                "state": run.state,
                "fencing_token": fencing_token,
            },
        )
        if effect.late:
            from .common import notify_run_changed

            notify_run_changed(run)
    return effect
