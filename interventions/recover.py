"""Recover: after a worker disappears (its lease expired without release), reconcile durable state with
the world, then choose the next action by explicit rules and record why that choice is safe.

``on_orphaned`` (called by the beat scan for each newly orphaned run) issues the intervention as the
control plane itself; an operator may issue it too. The job :func:`run_recovery`:

1. reconciles every in-flight or unknown effect with the external system (network: no transaction);
2. then, in one transaction with the run locked: rebuilds the state from the last checkpoint plus
   the history after it, verifies the history chain and the checkpoint's hash, checks that a worker
   reports the run's pinned versions, and applies the first matching rule of :data:`RULES`.

The RecoveryReport (what was found, every check, the choice and its reason) goes on the receipt, into
the run's history and into the audit log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, TypedDict

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.chain.hashing import canonical, normalise
from audit.services import record_audit
from core.actors import Actor, system_actor
from core.errors import Conflict, Invalid
from core.roles import ADMIN, INCIDENT_COMMANDER, OPERATOR
from interventions import cards, facts, jobs
from interventions.base import finish_job, issue, lock_pending_job
from interventions.compensate import plan_options, start_plan
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from interventions.reconcile import auto_reconcile
from interventions.retry import policy as retry_policy
from runs.models import Checkpoint, Effect, ExecutionLease, HistoryEvent, Run
from runs.selectors import latest_checkpoint, unresolved_effects, verify_history
from runs.services.decisions import apply_transition
from runs.services.history import append_history
from runs.services.lifecycle import expire_leases, set_resume_point
from runs.states import Event, State

PREFERENCES = ("redrive", "compensate", "escalate")
ORPHAN_GRACE_S = 60  # an orphan this long without a recovery: the scan issues one again
RULES = [
    "history chain broken -> escalate",
    "last checkpoint does not match its hash or its history record -> escalate",
    "an effect still in flight or unknown after reconciliation -> escalate",
    "options.prefer == 'escalate' -> escalate",
    "options.prefer == 'compensate' -> compensate (compensators run in the control plane, so the agent's "
    "versions do not matter for it)",
    "no worker reports the run's pinned versions -> escalate",
    "attempts used up under the retry policy -> escalate",
    "otherwise -> redrive from the last checkpoint (retry from the start when there is none)",
]


def _dead_lease(run: Run) -> dict[str, Any] | None:
    lease = ExecutionLease.objects.filter(run=run).order_by("-fencing_token").first()
    if lease is None:
        return None
    return {
        "id": str(lease.pk),
        "worker": lease.worker,
        "fencing_token": lease.fencing_token,
        "status": lease.status,
        "expires_at": lease.expires_at.isoformat(),
        "end_reason": lease.end_reason,
    }


def version_check(run: Run) -> dict[str, Any]:
    """Is there a worker for the run's pinned versions? ``Agent.current_versions`` is what the agent's
    workers reported at their latest claim. Empty means no worker ever said: that is *unknown*, and
    unknown is runnable only if the run pins nothing (nothing can mismatch); otherwise not confirmed."""
    pinned, current = run.versions or {}, run.agent.current_versions or {}
    if not pinned:
        return {
            "runnable": True,
            "pinned": pinned,
            "current": current,
            "differences": [],
            "note": "the run pins no versions: any worker of the agent may run it",
        }
    if not current:
        return {
            "runnable": False,
            "pinned": pinned,
            "current": current,
            "differences": [],
            "unknown": True,
            "note": f"no worker of {run.agent.name!r} has reported its versions: the pinned ones cannot be confirmed",
        }
    diffs = []
    for key, want in pinned.items():
        have = current.get(key)
        if isinstance(want, dict):
            diffs += [
                {"key": f"{key}.{k}", "then": v, "now": (have or {}).get(k)}
                for k, v in want.items()
                if (have or {}).get(k) != v
            ]
        elif have != want:
            diffs.append({"key": key, "then": want, "now": have})
    return {
        "runnable": not diffs,
        "pinned": pinned,
        "current": current,
        "differences": diffs,
        "note": "a worker reports the run's versions"
        if not diffs
        else "the agent's workers now run other versions",
    }


def _checkpoint_check(run: Run, cp: Checkpoint | None) -> dict[str, Any]:
    if cp is None:
        return {"ok": True, "note": "no checkpoint: a new attempt starts from the beginning"}
    digest = hashlib.sha256(
        canonical(
            {
                "run": str(run.pk),
                "seq": cp.seq,
                "step": cp.step,
                "state": cp.state,
                "versions": cp.versions,
            }
        )
    ).hexdigest()
    recorded = HistoryEvent.objects.filter(run=run, kind="checkpoint", data__seq=cp.seq).first()
    problems = []
    if digest != cp.hash:
        problems.append("the snapshot does not match its hash")
    if recorded is None or recorded.data.get("hash") != cp.hash:
        problems.append("the history does not record this checkpoint with this hash")
    return {"ok": not problems, "seq": cp.seq, "hash": cp.hash, "problems": problems}


def rebuild_state(run: Run) -> dict[str, Any]:
    """The last checkpoint plus what the history says happened after it."""
    cp = latest_checkpoint(run)
    after = cp.history_seq if cp else 0
    events = list(HistoryEvent.objects.filter(run=run, seq__gt=after).order_by("seq"))
    effect_ids = [ev.data.get("effect") for ev in events if ev.kind == "effect_intent"]
    effects = {str(e.pk): e for e in Effect.objects.filter(pk__in=[i for i in effect_ids if i])}
    rows, steps = [], []
    for eid in effect_ids:
        e = effects.get(eid)
        if e is None:
            continue
        rows.append(
            {
                "effect": eid,
                "kind": e.kind,
                "step": e.step,
                "tool": e.tool,
                "action": e.action,
                "idempotency_key": e.idempotency_key,
                "status": e.status,
                "reconciled": e.reconciled,
                "on_redrive": _on_redrive(e),
            }
        )
    for ev in events:
        name = (
            ev.data.get("step")
            if ev.kind in ("step_started", "effect_intent", "step_completed")
            else None
        )
        if name and name not in steps:
            steps.append(name)
    return {
        "checkpoint": {
            "seq": cp.seq,
            "step": cp.step,
            "history_seq": cp.history_seq,
            "state": cp.state,
        }
        if cp
        else None,
        "history_after_checkpoint": [
            {"seq": ev.seq, "kind": ev.kind, "actor": ev.actor} for ev in events
        ],
        "effects_after_checkpoint": rows,
        "steps_to_rerun": steps,
    }


def _on_redrive(e: Effect) -> str:
    if e.status == Effect.COMMITTED:
        return "replays: the same key returns the recorded effect; nothing is dispatched again"
    if e.status == Effect.FAILED:
        return "runs again under the same key (the external system saw no commit)"
    return "blocks: outcome not known"


@dataclass
class RecoveryReport:
    trigger: str
    dead_lease: dict[str, Any] | None
    reconciliation: list[dict[str, Any]]
    rebuilt: dict[str, Any] = field(default_factory=dict)
    history: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    unresolved_after: list[dict[str, Any]] = field(default_factory=list)
    attempts: dict[str, Any] = field(default_factory=dict)
    decision: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return normalise({"rules": RULES, **asdict(self)})


def choose(report: RecoveryReport, prefer: str) -> tuple[str, str]:
    """(action, why): the first rule that matches, in the order of RULES."""
    if not report.history.get("ok"):
        return (
            "escalate",
            f"history chain broken at seq {report.history.get('first_broken_seq')} ({report.history.get('problem')})",
        )
    if not report.checkpoint.get("ok"):
        return (
            "escalate",
            f"checkpoint {report.checkpoint.get('seq')}: {'; '.join(report.checkpoint['problems'])}",
        )
    if report.unresolved_after:
        keys = ", ".join(e["idempotency_key"] for e in report.unresolved_after)
        return (
            "escalate",
            f"{len(report.unresolved_after)} effect(s) still of unknown outcome after asking the world: {keys}",
        )
    if prefer == "escalate":
        return "escalate", "the operator asked for a human decision"
    if prefer == "compensate":
        return "compensate", "all effects are accounted for; compensation was preferred"
    if not report.versions.get("runnable"):
        return "escalate", f"versions not runnable: {report.versions.get('note')}"
    if report.attempts["used"] >= report.attempts["max"]:
        return (
            "escalate",
            f"{report.attempts['used']} of {report.attempts['max']} attempts used under the retry policy",
        )
    return ("redrive" if report.rebuilt.get("checkpoint") else "retry"), _why_safe(report)


def _why_safe(report: RecoveryReport) -> str:
    rebuilt, cp = report.rebuilt, report.rebuilt.get("checkpoint")
    after = rebuilt["effects_after_checkpoint"]
    committed = [e for e in after if e["status"] == Effect.COMMITTED]
    reconciled = [
        r
        for r in report.reconciliation
        if r.get("outcome") in (Effect.COMMITTED, Effect.FAILED) and not r.get("already")
    ]
    start = (
        f"checkpoint {cp['seq']} ({cp['step']!r})"
        if cp
        else "the beginning (no checkpoint was written)"
    )
    token = (report.dead_lease or {}).get("fencing_token")
    return (
        f"every effect is accounted for ({len(reconciled)} reconciled with the external system just now); the history "
        f"chain verified ({report.history.get('checked')} events); {report.versions.get('note')}. The new "
        f"attempt starts from {start}: steps after it ({', '.join(rebuilt['steps_to_rerun']) or 'none'}) run again "
        f"with the same idempotency keys, so the {len(committed)} effect(s) they already committed replay instead of "
        f"repeating; the dead worker's fencing token {token} is refused from now on (the next claim gets a higher one)."
    )


# -- the contract -----------------------------------------------------------------------------------


def _prefer(req: Request) -> str:
    prefer = req.options.get("prefer", "redrive")
    if prefer not in PREFERENCES:
        raise Invalid(f"options.prefer must be one of {list(PREFERENCES)}", field="options.prefer")
    return prefer


class RecoverPreview(TypedDict):
    """What a recovery would check and the rules it would choose the next action by."""

    prefer: str
    dead_lease: Row | None
    checkpoint: Row | None
    to_reconcile: Rows
    versions: Row
    rules: Any
    how: str


class RecoverReceipt(TypedDict):
    state: str
    prefer: str
    dead_lease: Row | None
    job: Row
    fencing: str


def preview(run: Run, req: Request, actor: Actor) -> RecoverPreview:
    return {
        "prefer": _prefer(req),
        "dead_lease": _dead_lease(run),
        "checkpoint": facts.resume_point(run),
        "to_reconcile": unresolved_effects(run),
        "versions": version_check(run),
        "rules": RULES,
        "how": "a job reconciles every unknown effect with the world, rebuilds state from the last checkpoint "
        "plus history, verifies the history chain and versions, then applies the first matching rule",
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> RecoverReceipt:
    prefer = _prefer(req)
    if prefer == "compensate":
        plan_options(
            req.options.get("compensation") or {}
        )  # refuse bad options now, not in the job
    apply_transition(run, Event.RECOVER, actor=actor, reason=req.reason, data={"prefer": prefer})
    Intervention.objects.filter(pk=intervention.pk).update(status=Intervention.PENDING)
    intervention.status = Intervention.PENDING
    job = jobs.enqueue("recovery", intervention.pk, run)
    return {
        "state": run.state,
        "prefer": prefer,
        "dead_lease": _dead_lease(run),
        "job": {"status": "queued", "id": str(job.pk)},
        "fencing": f"writes carrying fencing token {run.fencing_token} or older are refused",
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def recover_card(p: Mapping[str, Any]) -> Answers:
    lease = p.get("dead_lease") or {}
    versions = p.get("versions") or {}
    diffs = versions.get("differences") or []
    return [
        cards.answer(
            "dead_lease",
            "Lost worker",
            f"{lease.get('worker')} (fencing token {lease.get('fencing_token')}, "
            f"lease {lease.get('status')}); its writes will be refused"
            if lease
            else "",
            cards.table(
                ["worker", "lease expired", "why"],
                [
                    cards.row(
                        cards.cell("text", lease.get("worker")),
                        cards.cell("time", lease.get("expires_at")),
                        cards.cell("text", lease.get("end_reason") or ""),
                    )
                ]
                if lease
                else [],
            ),
            empty="no lease was ever granted",
        ),
        cards.answer(
            "to_reconcile",
            "Asked of the world first",
            "",
            cards.unresolved_table(p.get("to_reconcile") or []),
            empty="nothing to reconcile",
        ),
        cards.answer(
            "rebuild_from",
            "State rebuilt from",
            cards.checkpoint_text(p.get("checkpoint")) + ", plus the history after it",
            cards.checkpoint_table(p.get("checkpoint")),
        ),
        cards.answer(
            "versions",
            "Versions",
            versions.get("note", ""),
            cards.table(
                ["version", "pinned", "workers now"],
                [
                    cards.row(
                        cards.cell("code", d["key"]),
                        cards.cell("value", d["then"]),
                        cards.cell("value", d["now"]),
                    )
                    for d in diffs
                ],
            ),
            tone="bad" if versions.get("runnable") is False else "",
        ),
        cards.answer(
            "prefer",
            "Preferred next action",
            f"{p.get('prefer')} — the first matching rule decides, and says why it is safe",
        ),
    ]


def recover_receipt(r: Mapping[str, Any]) -> Answers:
    lease = r.get("dead_lease") or {}
    return [
        cards.answer("fencing", "Zombie writes", r.get("fencing", "")),
        cards.answer(
            "dead_lease",
            "Lost worker",
            f"{lease.get('worker')} (fencing token {lease.get('fencing_token')})" if lease else "",
            empty="none",
        ),
        cards.answer(
            "prefer", "Preferred next action", f"{r.get('prefer')}; the recovery gate below decides"
        ),
    ]


def recover_more(p: Mapping[str, Any]) -> Answers:
    if not p.get("rules"):
        return []
    return [cards.answer("rules", "The rules, in order", "", items=list(p["rules"]))]


CONTRACTS = (
    Contract(
        kind="recover",
        event=Event.RECOVER,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="reconcile durable state with the world after a worker disappears",
            stops=(),
            continues=(
                "replay, redrive, retry, compensate or escalate, with the reason it is safe",
            ),
            cascade="this run only",
            authority="the dead worker's fencing token is refused",
            jobs=(
                "recovery: rebuild from checkpoint + history, verify chain, check versions, reconcile, choose",
            ),
            claims=("orphan_detected", "chain_verified", "zombie_refused"),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            card=recover_card, receipt=recover_receipt, more=recover_more, fields=("prefer",)
        ),
        order=80,
        owner_bound=True,
    ),
)


def on_orphaned(run_id: Any) -> Intervention | None:
    """The beat scan found the run's lease expired without release. The control plane itself issues
    the recovery: there is no operator role to check, and the run's decision authority is not asked --
    recovering an orphan is policy, recorded as such. ``RECOVERY_AUTOMATIC=False`` leaves it to people."""
    if not getattr(settings, "RECOVERY_AUTOMATIC", True):
        return None
    actor = system_actor("recovery-scan")
    req = Request(
        kind="recover",
        reason="execution lease expired without release: the worker disappeared",
        options={"trigger": "lease_expired"},
    )
    try:
        return issue(actor=actor, run_id=run_id, req=req, policy="automatic on lease expiry")
    except Conflict:
        return None  # someone (an operator, an earlier scan) already moved the run on; recorded as denied


@shared_task(acks_late=True)
def scan_expired_leases(grace_s: int = ORPHAN_GRACE_S) -> list[str]:
    """The beat scan: leases that expired without release orphan their runs (or finish a pause or cancel
    the worker never acknowledged); each orphan gets its recovery issued. An orphan left ``grace_s``
    without one (the issue failed after the orphaning committed) gets it on a later scan. Once issued, a
    recovery is an outbox job: the job sweep (interventions/jobs.py) delivers it until it is done."""
    orphaned = expire_leases(actor=system_actor("recovery-scan"))
    for run_id in orphaned:
        on_orphaned(run_id)
    return orphaned + _recover_forgotten_orphans(grace_s)


def _recover_forgotten_orphans(grace_s: int) -> list[str]:
    cutoff = timezone.now() - timedelta(seconds=grace_s)
    forgotten = Run.objects.filter(state=State.ORPHANED, state_changed_at__lte=cutoff)
    return [
        str(run_id)
        for run_id in forgotten.values_list("pk", flat=True)
        if on_orphaned(run_id) is not None
    ]


# -- the job ----------------------------------------------------------------------------------------


@shared_task(acks_late=True)
def run_recovery(intervention_id: str) -> dict[str, Any]:
    """Idempotent: a second delivery finds the job done, or the intervention concluded (or the run
    moved on), and stops."""
    return jobs.perform("recovery", intervention_id, lambda: _recover(intervention_id))


def _recover(intervention_id: str) -> dict[str, Any]:
    intervention = Intervention.objects.select_related("run").get(pk=intervention_id)
    if intervention.status != Intervention.PENDING or intervention.run.state != State.RECOVERING:
        return {"skipped": "already concluded"}
    actor = system_actor("recovery")
    reconciliation = []
    for effect in (
        Effect.objects.filter(run_id=intervention.run_id).unresolved().order_by("declared_at")
    ):
        reconciliation.append(_reconcile_one(effect, actor))  # network: outside any transaction
    return conclude_recovery(intervention_id, reconciliation)


def _reconcile_one(effect: Effect, actor: Actor) -> dict[str, Any]:
    base = {
        "effect": str(effect.pk),
        "idempotency_key": effect.idempotency_key,
        "tool": effect.tool,
        "action": effect.action,
        "was": effect.status,
    }
    try:
        return base | auto_reconcile(effect.pk, actor)
    except Exception as exc:  # a reconciler bug leaves the effect unknown -> the rules escalate
        return base | {"outcome": "unknown", "why": f"reconciler raised {exc!r}"}


def conclude_recovery(intervention_id: str, reconciliation: list[dict[str, Any]]) -> dict[str, Any]:
    actor = system_actor("recovery")
    with transaction.atomic(durable=True):
        locked = lock_pending_job(intervention_id, State.RECOVERING)
        if locked is None:
            return {"skipped": "already concluded, or the run has moved on"}
        intervention, run = locked
        cp, pol = latest_checkpoint(run), retry_policy(run)
        report = RecoveryReport(
            trigger=intervention.options.get("trigger", "operator"),
            dead_lease=_dead_lease(run),
            reconciliation=reconciliation,
            rebuilt=rebuild_state(run),
            history=verify_history(run),
            checkpoint=_checkpoint_check(run, cp),
            versions=version_check(run),
            unresolved_after=unresolved_effects(run),
            attempts={"used": run.attempt_count, "max": pol["max_attempts"]},
        )
        action, why = choose(report, intervention.options.get("prefer", "redrive"))
        report.decision = {
            "action": action,
            "why": why,
            **_enact(run, intervention, action, why, cp, actor),
        }
        body = report.as_dict()
        append_history(
            run,
            "recovery_report",
            {
                "intervention": str(intervention.pk),
                "action": action,
                "why": why,
                "history_ok": report.history.get("ok"),
                "reconciled": len(reconciliation),
            },
            actor=actor,
        )
        record_audit(
            actor=actor,
            action="recovery.decided",
            object_type="run",
            object_id=run.pk,
            run_id=run.pk,
            reason=why,
            context={"intervention": str(intervention.pk), "report": body},
        )
        finish_job(
            intervention,
            Intervention.COMPLETED,
            {"kind": "recovery", "action": action, "why": why, "state": run.state, "report": body},
        )
    return body


def _enact(
    run: Run, intervention: Intervention, action: str, why: str, cp: Checkpoint | None, actor: Actor
) -> dict[str, Any]:
    if action == "escalate":
        apply_transition(
            run, Event.RECOVERY_ESCALATE, actor=actor, reason=f"escalated to a human: {why}"
        )
        return {
            "next_state": run.state,
            "next": "a person decides: reconcile, resume, compensate or cancel",
        }
    if action == "compensate":
        apply_transition(run, Event.RECOVERY_COMPENSATE, actor=actor, reason=why)
        plan = start_plan(
            run, intervention, actor, plan_options(intervention.options.get("compensation") or {})
        )
        return {"next_state": run.state, "plan_id": str(plan.pk)}
    set_resume_point(run, cp, claimable_after=None)
    apply_transition(
        run,
        Event.RECOVERY_REDRIVE,
        actor=actor,
        reason=why,
        data={
            "from_checkpoint": cp.seq if cp else None,
            "refused_fencing_token": run.fencing_token,
        },
    )
    return {
        "next_state": run.state,
        "from_checkpoint": {"seq": cp.seq, "step": cp.step} if cp else None,
        "refused_fencing_token": run.fencing_token,
    }


jobs.register_kind("recovery", run_recovery, jobs.give_up_intervention)
