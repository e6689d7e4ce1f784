"""The effect ledger: declare before dispatch, record the outcome after. The hot path of the protocol."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone

from audit.chain.append import appending
from audit.chain.hashing import canonical
from audit.models import AuditEvent
from audit.services import audit_event, record_audit
from core import pg
from core.actors import Actor
from core.errors import (
    Conflict,
    DomainError,
    EffectUnresolved,
    IdempotencyKeyReused,
    Invalid,
    LeaseLost,
    NotFound,
)
from core.pg.rows import from_json, hot_cursor, select_rows, write_rows
from runs.models import (
    Approval,
    ApprovalPolicy,
    AuthorityGrant,
    Checkpoint,
    Effect,
    ExecutionLease,
    Run,
)
from runs.selectors import effect_dict
from runs.states import EFFECT_STATES, State, denial_reason

from .approvals import approval_denial
from .decisions import decision, lock_run
from .discrepancy import record_discrepancy, reported_again
from .freeze import (
    FREEZE_JSON_SQL,
    STANDING_JSON_SQL,
    capability_frozen,
    live_freeze,
    standing_from_json,
    standing_frozen,
    standing_rows,
)
from .history import history_head, next_history
from .lifecycle import check_lease

OUTCOMES = (Effect.COMMITTED, Effect.FAILED, Effect.UNKNOWN)


def fingerprint(tool: str, action: str, args: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({"tool": tool, "action": action, "args": args})).hexdigest()


@dataclass
class Declaration:
    effect: Effect
    decision: str  # authorized | replayed | denied
    detail: str = ""  # a denial's sentence: for a freeze, which one, who set it and why
    freeze: dict[str, Any] | None = None  # the freeze that denied it

    def as_dict(self) -> dict[str, Any]:
        out = effect_dict(self.effect) | {"decision": self.decision}
        if self.decision == "denied":
            out |= {"detail": self.detail or self.effect.denial_reason, "freeze": self.freeze}
        return out


@dataclass
class Facts:
    """What a declaration decides on, read in ONE statement once the run is locked (a new snapshot in
    READ COMMITTED, so everything committed before the lock was granted is seen): the lease with the
    caller's fencing token, the authorised effect with the key, the run's grants, the agent's approval
    policies for the tool, the run's latest approval for tool:action and a live freeze covering it."""

    lease: ExecutionLease | None
    existing: Effect | None
    grants: list[AuthorityGrant]
    policies: list[ApprovalPolicy]
    latest_approval: Approval | None
    freeze: tuple[str, str, str] | None  # a live capability freeze covering tool:action (freeze.py)
    standing: list[tuple[Any, ...]]  # live standing freezes of tool:action that may cover the run


def _facts_sql() -> str:
    t = {
        m.__name__: m._meta.db_table
        for m in (ExecutionLease, Effect, AuthorityGrant, ApprovalPolicy, Approval)
    }
    return (
        f"SELECT (SELECT row_to_json(l) FROM {t['ExecutionLease']} l"
        "         WHERE l.run_id = %(run)s AND l.fencing_token = %(token)s),"
        f"       (SELECT row_to_json(e) FROM {t['Effect']} e WHERE e.run_id = %(run)s"
        "         AND e.idempotency_key = %(key)s AND e.decision = 'authorized' LIMIT 1),"
        f"       (SELECT json_agg(g) FROM {t['AuthorityGrant']} g WHERE g.run_id = %(run)s),"
        f"       (SELECT json_agg(p) FROM {t['ApprovalPolicy']} p"
        "         WHERE p.agent_id = %(agent)s AND p.tool = %(tool)s),"
        f"       (SELECT row_to_json(a) FROM {t['Approval']} a WHERE a.run_id = %(run)s"
        "         AND a.tool = %(tool)s AND a.action = %(action)s ORDER BY a.requested_at DESC LIMIT 1),"
        f"       ({FREEZE_JSON_SQL}),"
        f"       ({STANDING_JSON_SQL})"
    )


_FACTS_SQL: list[str] = []


def declaration_facts(
    run: Run, fencing_token: int, idempotency_key: str, tool: str, action: str
) -> Facts:
    from django.db import connection

    if not pg.enabled(connection):  # the SQLite demo: the same reads, one by one
        from core.pg.rows import select_row

        return Facts(
            select_row(ExecutionLease, run=run.pk, fencing_token=int(fencing_token)),
            select_row(
                Effect, run=run.pk, idempotency_key=idempotency_key, decision=Effect.AUTHORIZED
            ),
            select_rows(AuthorityGrant, run=run.pk),
            select_rows(ApprovalPolicy, agent=run.agent_id, tool=tool),
            select_row(Approval, run=run.pk, tool=tool, action=action, order_by=("-requested_at",)),
            live_freeze(run.pk, tool, action),
            standing_rows(run, tool, action),
        )
    if not _FACTS_SQL:
        _FACTS_SQL.append(_facts_sql())
    params: dict[str, Any] = {
        "run": run.pk,
        "token": int(fencing_token),
        "key": idempotency_key,
        "agent": run.agent_id,
        "tool": tool,
        "action": action,
        "scope": f"{tool}:{action}",
        "wildcard": f"{tool}:*",
    }
    with hot_cursor(connection) as cursor:
        cursor.execute(_FACTS_SQL[0], params)
        lease, existing, grants, policies, latest, freeze, standing = cursor.fetchone()
    return Facts(
        from_json(ExecutionLease, lease),
        from_json(Effect, existing),
        [g for g in (from_json(AuthorityGrant, row) for row in grants or ()) if g is not None],
        [p for p in (from_json(ApprovalPolicy, row) for row in policies or ()) if p is not None],
        from_json(Approval, latest),
        tuple(freeze) if freeze else None,
        standing_from_json(standing),
    )


def _authority_denial(
    run: Run, tool: str, action: str, now, grants: list[AuthorityGrant] | None = None
) -> str | None:
    """None if an active grant (and its whole delegation chain) covers tool:action, else the reason."""
    statuses = []
    # A delegated grant's source (and its source) load lazily: only child runs have any.
    for grant in grants if grants is not None else select_rows(AuthorityGrant, run=run.pk):
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
        facts = declaration_facts(run, fencing_token, idempotency_key, tool, action)
        try:
            check_lease(run, facts.lease, fencing_token, now)
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
        if facts.existing is not None:
            return _replay(run, actor, facts.existing, fp)
        reason = None if run.state in EFFECT_STATES else denial_reason(run.state)
        reason = reason or _authority_denial(run, tool, action, now, facts.grants)
        approval, detail, frozen = None, "", None
        if reason is None:
            reason, detail = capability_frozen(run.pk, tool, action, facts.freeze)
            if reason is not None and facts.freeze is not None:
                scope, why, by = facts.freeze
                frozen = {"kind": "run", "capability": scope, "frozen_by": by, "reason": why}
        if reason is None:
            reason, detail, frozen = standing_frozen(run, facts.standing)
        if reason is None:
            reason, approval, detail = approval_denial(
                run,
                approval_id,
                tool,
                action,
                args,
                policies=facts.policies,
                latest=facts.latest_approval,
            )
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
                frozen,
            )
        effect = Effect(
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
        event = next_history(
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
        if approval is not None:  # single use: the compare-and-swap makes a second consumer lose
            # (the effect it names is written just below: the foreign key is checked at COMMIT)
            used = Approval.objects.filter(pk=approval.pk, consumed_by__isnull=True).update(
                consumed_by=effect
            )
            if used != 1:
                raise Conflict("the approval was used by another declaration meanwhile")
        audit = audit_event(
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
        # The effect, its history link, the run's new head and the audit event: one statement.
        write_rows([effect, event], [(Run, run.pk, history_head(run, event))], [appending(audit)])
    return Declaration(effect, "authorized")


def _replay(run: Run, actor: Actor, existing: Effect, fp: str) -> Declaration:
    if existing.fingerprint != fp:
        raise IdempotencyKeyReused(
            f"idempotency key {existing.idempotency_key!r} was already used for different arguments",
            idempotency_key=existing.idempotency_key,
            effect_id=str(existing.pk),
        )
    if existing.compensation_status == "compensated":
        # Undone (a redrive compensated it first): replaying "committed" would tell the agent it
        # happened. Doing it again is a new effect under a new key (docs/concepts/contracts.md#redrive).
        raise IdempotencyKeyReused(
            f"effect {existing.pk} with key {existing.idempotency_key!r} was compensated: "
            "declare it again under a new idempotency key",
            idempotency_key=existing.idempotency_key,
            effect_id=str(existing.pk),
            compensated=True,
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
    run, actor, reason, detail, step, tool, action, key, fp, args, fencing_token, frozen=None
) -> Declaration:
    """Denied declarations are part of the ledger too (committed, not rolled back)."""
    effect = Effect(
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
        # Why, in words (a freeze: which one, who set it and why): the run page shows it.
        outcome_detail={"denied_because": detail, **({"freeze": frozen} if frozen else {})}
        if detail
        else {},
    )
    event = next_history(
        run,
        "effect_denied",
        {
            "effect": str(effect.pk),
            "tool": tool,
            "action": action,
            "idempotency_key": key,
            "reason": reason,
            "detail": detail,
            **({"freeze": frozen} if frozen else {}),
        },
        attempt=run.current_attempt_id,
        actor=actor,
    )
    audit = audit_event(
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
            **({"freeze": frozen} if frozen else {}),
        },
    )
    write_rows([effect, event], [(Run, run.pk, history_head(run, event))], [appending(audit)])
    return Declaration(effect, "denied", detail, frozen)


def effect_run_id(effect_id: Any) -> Any:
    """The run an effect belongs to, read before locking that run (every effect decision does)."""
    from django.db import connection

    # ``Effect.objects.values_list("run_id", flat=True).get(pk=…)`` without the query compiler: every
    # outcome starts here.
    try:
        pk = Effect._meta.pk.get_db_prep_value(effect_id, connection)
    except (ValueError, TypeError, ValidationError):
        pk = None
    row = None
    if pk is not None:
        with hot_cursor(connection) as cursor:
            cursor.execute(f"SELECT run_id FROM {Effect._meta.db_table} WHERE id = %s", [pk])
            row = cursor.fetchone()
    if row is None:
        raise NotFound(f"effect {effect_id} does not exist", object="effect")
    return Effect._meta.get_field("run").target_field.to_python(row[0])


@dataclass
class Recorded:
    """An outcome, and the step's checkpoint if it came with it: written, or refused (the outcome is
    recorded regardless: it is a fact about the world, the checkpoint a worker's claim to progress)."""

    effect: Effect
    checkpoint: Checkpoint | None = None
    checkpoint_refused: DomainError | None = None


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
    return record_outcome_with(
        actor=actor,
        effect_id=effect_id,
        fencing_token=fencing_token,
        status=status,
        external_ref=external_ref,
        detail=detail,
        run_id=run_id,
    ).effect


def _lock_effect(run: Run, effect_id: Any, fencing_token: Any) -> tuple[Effect | None, Any]:
    """The effect, locked, and the run's lease with ``fencing_token`` (None without one): one
    statement, read after the run lock (every lease writer takes it first)."""
    from django.db import connection

    if not pg.enabled(connection):
        from core.pg.rows import select_row

        lease = None
        if fencing_token is not None:
            lease = select_row(ExecutionLease, run=run.pk, fencing_token=int(fencing_token))
        return select_row(Effect, pk=effect_id, lock=True), lease
    try:
        pk = Effect._meta.pk.get_db_prep_value(effect_id, connection)
    except (ValueError, TypeError, ValidationError):
        return None, None
    sql = (
        f"SELECT row_to_json(e), (SELECT row_to_json(l) FROM {ExecutionLease._meta.db_table} l"
        "  WHERE l.run_id = %(run)s AND l.fencing_token = %(token)s)"
        f" FROM {Effect._meta.db_table} e WHERE e.id = %(effect)s FOR UPDATE OF e"
    )
    token = int(fencing_token) if fencing_token is not None else None
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, {"run": run.pk, "token": token, "effect": pk})
        row = cursor.fetchone()
    if row is None:
        return None, None
    return from_json(Effect, row[0]), from_json(ExecutionLease, row[1])


def record_outcome_with(
    *,
    actor: Actor,
    effect_id: Any,
    fencing_token: int | None,
    status: str,
    external_ref: str = "",
    detail: dict | None = None,
    run_id: Any = None,
    checkpoint: dict | None = None,
) -> Recorded:
    """``record_outcome``, plus the step's checkpoint (``{"step", "state"}``) in the same transaction
    when given: one commit for the end of a step. The checkpoint needs the run's current lease (the
    fencing token); if it is refused the outcome is still recorded and ``checkpoint_refused`` says why
    (audited as a refused ``run.checkpoint``)."""
    from .records import checkpoint_head, new_checkpoint, write_checkpoint

    if status not in OUTCOMES:
        raise Invalid("status must be committed, failed or unknown", field="status")
    run_id = run_id if run_id is not None else effect_run_id(effect_id)
    result: Recorded | None = None
    with decision(actor, "effect.outcome", "effect", effect_id, run_id):
        run = lock_run(run_id)
        effect, lease = _lock_effect(run, effect_id, fencing_token if checkpoint else None)
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
                result = Recorded(effect)  # the same report twice (e.g. an SDK retry)
            elif effect.reconciled and (
                status == Effect.UNKNOWN or reported_again(effect, status, external_ref)
            ):
                result = Recorded(effect)  # no news against what is already settled or contradicted
            elif effect.reconciled and effect.status != Effect.DISCREPANCY:
                result = Recorded(
                    record_discrepancy(
                        run,
                        effect,
                        actor=actor,
                        status=status,
                        external_ref=external_ref,
                        detail=detail,
                        fencing_token=fencing_token,
                        now=now,
                    )
                )
            else:
                raise Conflict(f"effect already recorded as {effect.status}", status=effect.status)
        else:
            result = Recorded(effect)
            _settle(run, effect, actor, status, external_ref, detail, fencing_token, now)
            inserts: list[Any] = [
                next_history(
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
            ]
            run_update = history_head(run, inserts[0])
            if checkpoint is not None:
                try:
                    check_lease(run, lease, fencing_token, now)
                except LeaseLost as lost:
                    result.checkpoint_refused = lost
                else:
                    cp, cp_event = new_checkpoint(
                        run, actor, checkpoint["step"], checkpoint.get("state")
                    )
                    inserts += [cp, cp_event]
                    run_update = checkpoint_head(run, cp_event)
                    result.checkpoint = cp
            audit = audit_event(
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
            # The outcome, its history link (and the checkpoint with its link), the run's head, the
            # audit event: one statement.
            write_rows(
                inserts,
                [
                    (Effect, effect.pk, {f: getattr(effect, f) for f in _OUTCOME_FIELDS}),
                    (Run, run.pk, run_update),
                ],
                [appending(audit)],
            )
            if effect.late:
                from .decisions import notify_run_changed

                notify_run_changed(run)
            checkpoint = None  # handled (written or refused) in this transaction
    if (
        result.checkpoint_refused is not None
    ):  # audited like any refused decision (decisions.decision)
        err = result.checkpoint_refused
        record_audit(
            actor=actor,
            action="run.checkpoint",
            object_type="run",
            object_id=run_id,
            run_id=run_id,
            outcome=AuditEvent.DENIED,
            reason=f"{err.code}: {err.detail}",
            context=err.payload(),
        )
    elif checkpoint is not None:  # an outcome reported again: the checkpoint is its own decision
        try:
            result.checkpoint = write_checkpoint(
                actor=actor,
                run_id=run_id,
                fencing_token=fencing_token,  # type: ignore[arg-type]
                step=checkpoint["step"],
                state=checkpoint.get("state"),
            )
        except (LeaseLost, Conflict, NotFound) as refused:
            result.checkpoint_refused = refused
    return result


_OUTCOME_FIELDS = ("status", "outcome_at", "external_ref", "outcome_detail", "late", "stale_lease")


def _settle(run, effect, actor, status, external_ref, detail, fencing_token, now) -> None:
    """The outcome's fields on the effect, flagged late or stale against the run (in memory)."""
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
