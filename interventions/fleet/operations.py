"""Fleet operations: one intervention across a filtered set of runs, in waves, under an error budget.

Preview (a pure read) says how many runs match, which the contract applies to and what each would do,
and what is in flight across them. Start records the parent :class:`FleetOperation` and one
:class:`FleetTarget` per run in one transaction, with the first wave as an outbox job
(interventions/jobs.py). Each wave (interventions/fleet/waves.py) issues the per-run contract through
``base.issue`` -- every run's decision is its own transaction, receipt and audit -- counts failures,
and halts the whole operation once they exceed the budget. An operator may halt it at any time.

Kinds: pause, resume, cancel and take_command (a transfer of decision authority to the incident
commander on every run). A freeze over the fleet is not one of them: it is a standing rule, its own
contract (interventions/fleet/freezes.py); freeze_capability and restore_capability are refused here
naming it (selection.RETIRED_KINDS).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from core.errors import Conflict, Forbidden, Invalid, NotFound, PreviewStale
from core.live import announce_fleet
from core.roles import may
from interventions import jobs
from interventions.base import user_for
from interventions.fleet.selection import (
    FLEET_KINDS,
    RETIRED_KINDS,
    select,
    selection_digest,
)
from interventions.models import FleetOperation, FleetTarget
from interventions.plugins import Request, get_contract
from runs.models import Effect, Run
from runs.services.decisions import decision
from runs.states import transition
from runs.team_scope import scoped

PREVIEW_ROWS = 25  # runs whose full per-run preview is shown; the rest are counted
MAX_WAVE_SIZE = 500
MAX_PAUSE_S = 3600


@dataclass(frozen=True)
class FleetParams:
    """How the operation rolls out, and what each run's contract is given."""

    options: dict[str, Any] = field(default_factory=dict)
    wave_size: int = 10
    pause_s: int = 0
    # Error budget: halt once more runs than this failed. Either or both; the stricter wins; neither = 0.
    max_failures: int | None = None
    max_failure_pct: float | None = None
    override_reason: str = ""

    def check(self) -> None:
        if not 1 <= self.wave_size <= MAX_WAVE_SIZE:
            raise Invalid(f"wave_size must be 1…{MAX_WAVE_SIZE}", field="wave_size")
        if not 0 <= self.pause_s <= MAX_PAUSE_S:
            raise Invalid(f"pause_s must be 0…{MAX_PAUSE_S} seconds", field="pause_s")
        if self.max_failures is not None and self.max_failures < 0:
            raise Invalid("max_failures must be 0 or more", field="max_failures")
        if self.max_failure_pct is not None and not 0 <= self.max_failure_pct <= 100:
            raise Invalid("max_failure_pct must be 0…100", field="max_failure_pct")

    def budget(self, total: int) -> int:
        limits = [self.max_failures] if self.max_failures is not None else []
        if self.max_failure_pct is not None:
            limits.append(math.floor(total * self.max_failure_pct / 100))
        return min(limits) if limits else 0


def check_kind(kind: str) -> str:
    if kind in RETIRED_KINDS:
        raise Invalid(
            f"a fleet {kind} is retired: a freeze over the fleet stands until restored and covers "
            f"runs started later too; use {RETIRED_KINDS[kind]}",
            field="kind",
            use=RETIRED_KINDS[kind],
        )
    if kind not in FLEET_KINDS:
        raise Invalid(
            f"unknown fleet operation kind {kind!r}; one of {sorted(FLEET_KINDS)}", field="kind"
        )
    return FLEET_KINDS[kind]


def authorize_fleet(actor: Actor, kind: str, *, recorded: bool = False) -> None:
    """Operators run fleet pause / resume / cancel; take command is the incident commander's
    (core.roles: "fleet" plus the per-run right, or "take_command"). ``recorded``: an operation
    already recorded (to halt, confirm or cancel it), whose kind may be one retired since."""
    if not (recorded and kind in RETIRED_KINDS):
        check_kind(kind)
    if actor.is_worker:
        raise Forbidden("a worker token can never run a fleet operation")
    right = "take_command" if kind == "take_command" else kind
    if not (may(actor.roles, "fleet") and may(actor.roles, right)):
        raise Forbidden(
            f"role(s) {sorted(actor.roles) or ['none']} may not run a fleet {kind}", kind=kind
        )


def contract_options(kind: str, actor: Actor, options: dict[str, Any]) -> dict[str, Any]:
    if kind == "take_command":
        return {"facets": ["decision_authority"], "to": actor.name}
    return dict(options)


def _in_flight(targets: list[Run]) -> dict[str, Any]:
    rows = (
        Effect.objects.filter(
            run__in=[r.pk for r in targets], decision=Effect.AUTHORIZED, status=Effect.IN_FLIGHT
        )
        .values("tool", "action")
        .annotate(effects=Count("id"), runs=Count("run", distinct=True))
        .order_by("-effects", "tool", "action")
    )
    by_scope = [dict(r) for r in rows]
    return {"effects": sum(r["effects"] for r in by_scope), "by_tool_action": by_scope}


def _run_preview(run: Run, kind: str, req: Request, actor: Actor) -> dict[str, Any]:
    """The per-run contract's own preview, summarised to what a fleet table can show."""
    contract = get_contract(FLEET_KINDS[kind])
    step = transition(run.state, contract.event) if contract.event else None
    try:
        body = contract.preview(run, req, actor)
    except Exception as err:  # a contract's dependency raising: shown, not fatal to the preview
        return {"id": str(run.pk), "state": run.state, "problem": f"{type(err).__name__}: {err}"}
    return {
        "id": str(run.pk),
        "agent": run.agent.name,
        "state": run.state,
        "next_state": step.target.value if step else run.state,
        "in_flight_effects": len(body.get("in_flight_effects") or []),
        "blocked_by": body.get("blocked_by") or [],
        "decision_authority": run.decision_authority.username if run.decision_authority else None,
    }


def preview_fleet_operation(
    *, actor: Actor, kind: str, run_filter: str, params: FleetParams
) -> dict[str, Any]:
    """How many runs, what each would do, what is in flight. Changes nothing."""
    authorize_fleet(actor, kind)
    params.check()
    options = contract_options(kind, actor, params.options)
    sel = select(actor, kind, run_filter, options)
    req = Request(kind=FLEET_KINDS[kind], reason="preview", options=options)
    total = len(sel.targets)
    waves = math.ceil(total / params.wave_size) if total else 0
    return {
        "kind": kind,
        "contract": FLEET_KINDS[kind],
        "filter": run_filter,
        "options": options,
        "matched": sel.matched,
        "will_act_on": total,
        "excluded": len(sel.excluded),
        "excluded_runs": [
            {"id": str(r.pk), "state": r.state, "why": why}
            for r, why in sel.excluded[:PREVIEW_ROWS]
        ],
        "runs": [_run_preview(r, kind, req, actor) for r in sel.targets[:PREVIEW_ROWS]],
        "runs_not_shown": max(total - PREVIEW_ROWS, 0),
        "in_flight": _in_flight(sel.targets),
        "waves": waves,
        "wave_size": params.wave_size,
        "pause_s": params.pause_s,
        "max_failures": params.budget(total),
        "takes_at_least_s": max(waves - 1, 0) * params.pause_s,
        "digest": selection_digest(kind, options, sel.targets),
    }


def start_fleet_operation(
    *,
    actor: Actor,
    kind: str,
    run_filter: str,
    reason: str,
    params: FleetParams,
    digest: str = "",
    hold: bool = False,
) -> FleetOperation:
    """One transaction: the parent record, one target per run (in waves), the first wave's job.
    ``hold``: record it ``previewed`` instead -- its runs fixed, nothing issued -- until
    :func:`confirm_fleet_operation` (or :func:`cancel_fleet_operation`)."""
    op_id = uuid.uuid4()
    with decision(actor, "fleet.start", "fleet_operation", op_id):
        authorize_fleet(actor, kind)
        if not reason.strip():
            raise Invalid("a reason is required for every fleet operation", field="reason")
        params.check()
        options = contract_options(kind, actor, params.options)
        sel = select(actor, kind, run_filter, options)
        if not sel.targets:
            raise Conflict(
                f"none of the {sel.matched} matching run(s) can be acted on"
                + (f": {sel.excluded[0][1]}" if sel.excluded else ""),
                matched=sel.matched,
            )
        now_digest = selection_digest(kind, options, sel.targets)
        if digest and digest != now_digest:
            raise PreviewStale(
                f"the selection changed since the preview ({len(sel.targets)} run(s) now): preview again",
                digest=now_digest,
            )
        total, now = len(sel.targets), timezone.now()
        op = FleetOperation.objects.create(
            id=op_id,
            kind=kind,
            run_filter=run_filter,
            reason=reason,
            options=options,
            override_reason=params.override_reason,
            wave_size=params.wave_size,
            pause_s=params.pause_s,
            max_failures=params.budget(total),
            max_failure_pct=params.max_failure_pct,
            state=FleetOperation.PREVIEWED if hold else FleetOperation.RUNNING,
            total=total,
            excluded=len(sel.excluded),
            waves=math.ceil(total / params.wave_size),
            current_wave=1,
            next_wave_at=now,
            digest=now_digest,
            created_by=user_for(actor),
            created_by_label=actor.label,
            role=actor.role,
            team_id=_team_of(actor, sel.targets),
            created_at=now,
            started_at=None if hold else now,
        )
        FleetTarget.objects.bulk_create(
            FleetTarget(operation=op, run=run, position=i, wave=i // params.wave_size + 1)
            for i, run in enumerate(sel.targets)
        )
        record_audit(
            actor=actor,
            action="fleet.recorded" if hold else "fleet.started",
            object_type="fleet_operation",
            object_id=op.pk,
            reason=reason,
            context={**operation_facts(op), "filter": run_filter, "options": options},
        )
        if not hold:
            jobs.enqueue("fleet_wave", wave_key(op.pk, 1), None, timeout_s=wave_timeout_s(op))
    return op


def confirm_fleet_operation(*, actor: Actor, operation_id: Any) -> FleetOperation:
    """A held (``previewed``) operation starts: its recorded runs, its first wave now. Only by the
    operator who recorded it, whose name every run's decision carries."""
    with decision(actor, "fleet.confirm", "fleet_operation", operation_id):
        op = _locked(actor, operation_id)
        if op.created_by_id is None or op.created_by_id != actor.user_id:
            raise Forbidden(f"only {op.created_by_label} may start what they recorded")
        if op.state != FleetOperation.PREVIEWED:
            raise Conflict(f"the operation is already {op.state}", state=op.state)
        if op.kind in RETIRED_KINDS:  # held before the retirement: cancel it, set a standing one
            raise Conflict(
                f"a fleet {op.kind} is retired: cancel this held operation and use "
                f"{RETIRED_KINDS[op.kind]}",
                kind=op.kind,
            )
        now = timezone.now()
        op.state, op.started_at, op.next_wave_at = FleetOperation.RUNNING, now, now
        op.save(update_fields=["state", "started_at", "next_wave_at"])
        announce_fleet(op.pk)
        record_audit(
            actor=actor,
            action="fleet.started",
            object_type="fleet_operation",
            object_id=op.pk,
            reason=op.reason,
            context=operation_facts(op),
        )
        jobs.enqueue("fleet_wave", wave_key(op.pk, 1), None, timeout_s=wave_timeout_s(op))
    return op


def cancel_fleet_operation(*, actor: Actor, operation_id: Any, reason: str) -> FleetOperation:
    """A held operation is dropped before any run was touched: every target skipped, audited."""
    with decision(actor, "fleet.cancel", "fleet_operation", operation_id):
        if not reason.strip():
            raise Invalid("a reason is required to cancel a fleet operation", field="reason")
        op = _locked(actor, operation_id)
        if op.state != FleetOperation.PREVIEWED:
            raise Conflict(
                f"the operation is {op.state}: only a held one is cancelled (halt a running one)",
                state=op.state,
            )
        halt(op, actor, reason, automatic=False, to=FleetOperation.CANCELLED)
    return op


def _team_of(actor: Actor, targets: list[Run]) -> int | None:
    """The team an operation belongs to: its runs' team when they share one, else the operator's
    only team; else none (the default team's; across teams only cross_team people see it)."""
    teams = {run.team_id for run in targets}
    if len(teams) == 1:
        return teams.pop()
    mine = [t for t in actor.teams or () if t]
    return mine[0] if len(mine) == 1 and len(actor.teams or ()) == 1 else None


def _locked(actor: Actor, operation_id: Any) -> FleetOperation:
    op = scoped(FleetOperation.objects.select_for_update().filter(pk=operation_id), actor).first()
    if op is None:  # or another team's: as absent (docs/operator/teams.md)
        raise NotFound(f"fleet operation {operation_id} does not exist", object="fleet_operation")
    if op.created_by_id != actor.user_id:
        authorize_fleet(actor, op.kind, recorded=True)
    return op


def halt_fleet_operation(*, actor: Actor, operation_id: Any, reason: str) -> FleetOperation:
    """An operator stops the rollout: no run not yet reached is touched; those already decided stay."""
    with decision(actor, "fleet.halt", "fleet_operation", operation_id):
        if not reason.strip():
            raise Invalid("a reason is required to halt a fleet operation", field="reason")
        op = _locked(actor, operation_id)
        if op.state != FleetOperation.RUNNING:
            raise Conflict(f"the operation is already {op.state}", state=op.state)
        halt(op, actor, reason, automatic=False)
    return op


def halt(
    op: FleetOperation,
    actor: Actor,
    reason: str,
    *,
    automatic: bool,
    to: str = FleetOperation.HALTED,
) -> None:
    """Inside the caller's transaction, operation row locked: skip every target not yet reached."""
    now = timezone.now()
    pending = FleetTarget.objects.filter(operation=op, status=FleetTarget.PENDING)
    skipped_runs = [str(r) for r in pending.values_list("run_id", flat=True)]
    skipped = pending.update(
        status=FleetTarget.SKIPPED,
        detail=f"not issued: the operation was {to} ({reason})"[:2000],
        finished_at=now,
    )
    op.state, op.skipped = to, op.skipped + skipped
    op.halted_reason, op.halted_by, op.halted_automatically = reason, actor.label, automatic
    op.finished_at, op.next_wave_at = now, None
    op.save()
    announce_fleet(op.pk)
    record_audit(
        actor=actor,
        action=f"fleet.{to}",
        object_type="fleet_operation",
        object_id=op.pk,
        reason=reason,
        context={**operation_facts(op), "automatic": automatic, "skipped_runs": skipped_runs[:200]},
    )


def wave_timeout_s(op: FleetOperation) -> int:
    """A wave of many runs takes longer than one job: the sweep must not think it lost meanwhile."""
    return jobs.default_timeout_s() + 2 * op.wave_size


def wave_key(operation_id: Any, wave: int) -> str:
    return f"{operation_id}:{wave}"


def operation_facts(op: FleetOperation) -> dict[str, Any]:
    return {
        "operation": str(op.pk),
        "kind": op.kind,
        "state": op.state,
        "total": op.total,
        "succeeded": op.succeeded,
        "failed": op.failed,
        "skipped": op.skipped,
        "max_failures": op.max_failures,
        "waves": op.waves,
        "current_wave": op.current_wave,
        "wave_size": op.wave_size,
        "pause_s": op.pause_s,
    }
