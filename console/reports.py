"""Job reports on the run page and in receipts: a resume's revalidation, a compensation plan, a
recovery. Read-only; nothing is recomputed, only arranged for console/templates/console/job_reports.html."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any
from uuid import UUID

from interventions.models import CompensationPlan, CompensationStep, Intervention
from interventions.selectors import compensation_plans
from runs.models import Run

# --- job reports: a resume's revalidation, a compensation plan, a recovery --------------------------
# Each *_view turns a recorded report (receipt["job"], a CompensationPlan row) into what
# console/templates/console/job_reports.html draws. Read-only; nothing is recomputed, only arranged.

CHECKS = {
    "boundary": "Checkpoint boundary",
    "versions": "Code, model, tool and config versions",
    "assumptions": "Assumptions",
    "unknown_effects": "Effects of unknown outcome",
    "authority": "Authority now",
    "replay": "Steps that execute again",
}
# Receipt keys a report shows, left out of the generic "what happened" listing next to it.
REPORTED_KEYS = {
    "resume": ("job",),
    "compensate": ("job", "plan", "plan_id"),
    "recover": ("job", "compensation"),
}


def shown(value: Any) -> str:
    """A recorded JSON value as one line: strings as they are, anything else as compact JSON."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def report_for(
    i: Intervention, plans: dict[Any, list[dict[str, Any]]] | None = None
) -> dict[str, Any] | None:
    """The report of a resume, compensate or recover intervention (None for other kinds). ``plans``:
    the run's plan views by intervention id, when the caller has them already."""
    if i.kind == "resume":
        return revalidation_view(i)
    if i.kind not in ("compensate", "recover"):
        return None
    if plans is None:
        plans = {i.pk: [compensation_view(p) for p in compensation_plans(intervention=i)]}
    mine = plans.get(i.pk, [])
    if i.kind == "compensate":
        return (
            mine[0] if mine else None
        )  # no plan: the compensate was refused before one was written
    return recovery_view(i, mine[0] if mine else None)


def receipt_rest(i: Intervention, rep: dict[str, Any] | None) -> dict[str, Any]:
    """The receipt without what the intervention's report (``rep``) already shows."""
    if rep is None:
        return i.receipt
    return {k: v for k, v in i.receipt.items() if k not in REPORTED_KEYS.get(i.kind, ())}


def revalidation_view(i: Intervention) -> dict[str, Any]:
    job = i.receipt.get("job") or {}
    report = job.get("report")
    by_name = {c["name"]: c for c in (report or {}).get("checks", [])}
    names = [*CHECKS, *(n for n in by_name if n not in CHECKS)]
    checks = [
        {
            "name": n,
            "label": CHECKS.get(n, n.replace("_", " ")),
            "ok": by_name[n]["ok"] if n in by_name else None,
            "summary": by_name.get(n, {}).get("summary", ""),
        }
        for n in names
    ]

    def details(name: str) -> Any:
        return by_name.get(name, {}).get("details")

    assumptions = details("assumptions") or {}
    versions = details("versions") or {}
    outcome = job.get("outcome") or ("running" if report is None else "")
    return {
        "kind": "revalidation",
        "title": "Revalidation report",
        "intervention": str(i.pk),
        "status": i.status,
        "badge": outcome,
        "stamp": i.status,
        "pending": report is None,
        "ok": (report or {}).get("ok"),
        "failing": (report or {}).get("failing", []),
        "checked_at": (report or {}).get("checked_at", ""),
        "checks": checks,
        "boundary": details("boundary"),
        "boundary_summary": by_name.get("boundary", {}).get("summary", ""),
        "diff": [
            {"name": d.get("name"), "then": shown(d.get("then")), "now": shown(d.get("now"))}
            for d in versions.get("diff") or []
        ],
        "versions_summary": by_name.get("versions", {}).get("summary", ""),
        "stale": [
            {
                "key": a.get("key"),
                "recorded": shown(a.get("recorded")),
                "current": shown(a.get("current")),
                "observed_at": a.get("observed_at", ""),
                "problem": a.get("problem", ""),
            }
            for a in assumptions.get("stale") or []
        ],
        "fresh": [
            {
                "key": a.get("key"),
                "recorded": shown(a.get("recorded")),
                "current": shown(a.get("current")),
                "note": a.get("note", ""),
            }
            for a in assumptions.get("fresh") or []
        ],
        "unknown": details("unknown_effects") or [],
        "authority": details("authority") or [],
        "replay": [
            {"step": s.get("step"), "effects": s.get("effects") or []}
            for s in details("replay") or []
        ],
        "overridden": bool(job.get("overridden")),
        "override_by": i.actor_label,
        "override_role": i.role,
        "override_reason": i.override_reason,
        "outcome": outcome,
        "state": job.get("state", ""),
        "resume_from": i.receipt.get("resume_from"),
    }


def compensation_view(plan: CompensationPlan) -> dict[str, Any]:
    steps = list(plan.steps.all())  # prefetched in position order by compensation_plans
    count = Counter(s.status for s in steps)
    total, done, failed = len(steps), count[CompensationStep.DONE], count[CompensationStep.FAILED]
    rows = []
    for s in steps:
        e, error = s.effect, s.last_error or {}
        rows.append(
            {
                "position": s.position,
                "step": e.step,
                "tool": e.tool,
                "action": e.action,
                "key": e.idempotency_key,
                "effect": str(e.pk),
                "comp_tool": s.tool,
                "comp_action": s.action,
                "comp_key": s.idempotency_key,
                "status": s.status,
                "attempts": s.attempts,
                "failures": s.failures,
                "external_ref": s.external_ref,
                "last_error": " · ".join(
                    str(x) for x in (error.get("error"), error.get("message")) if x
                )
                if error
                else "",
                "last_error_at": error.get("at", ""),
                "retryable": error.get("retryable"),
                "next_attempt_at": s.next_attempt_at
                if s.status == CompensationStep.PENDING and s.failures
                else None,
            }
        )

    def effect_rows(rows_in: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "effect": r.get("effect", ""),
                "step": r.get("step", ""),
                "tool": r.get("tool", ""),
                "action": r.get("action", ""),
                "key": r.get("idempotency_key", ""),
                "why": r.get("why", ""),
                "irreversible": bool(r.get("irreversible")),
                "external_ref": r.get("external_ref") or "",
            }
            for r in rows_in or []
        ]

    attempts = sum(s.attempts for s in steps)
    return {
        "kind": "compensation",
        "title": "Compensation plan",
        "id": str(plan.pk),
        "intervention": str(plan.intervention_id),
        "status": plan.status,
        "badge": plan.status,
        "live": plan.status in CompensationPlan.LIVE,
        "stamp": f"{plan.status}-{done}-{failed}-{attempts}",
        "total": total,
        "done": done,
        "failed": failed,
        "finished": done + failed,
        "running": count[CompensationStep.RUNNING],
        "waiting": count[CompensationStep.PENDING],
        "steps": rows,
        "called_out": effect_rows(plan.called_out),
        "skipped": effect_rows(plan.skipped),
        "summary": (plan.result or {}).get("summary", ""),
        "options": plan.options,
        "created_at": plan.created_at,
        "started_at": plan.started_at,
        "finished_at": plan.finished_at,
    }


def recovery_view(i: Intervention, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """``plan``: the compensation plan view, when the recovery chose to compensate."""
    job = i.receipt.get("job") or {}
    report = job.get("report")
    prefer = i.options.get("prefer", "redrive")
    base_view = {
        "kind": "recovery",
        "title": "Recovery gate",
        "intervention": str(i.pk),
        "status": i.status,
        "stamp": f"{i.status}-{plan['stamp']}" if plan else i.status,
        "prefer": prefer,
        "plan": plan,
    }
    if report is None:
        return base_view | {
            "pending": True,
            "badge": "running",
            "trigger": i.options.get("trigger", "operator"),
            "dead_lease": i.receipt.get("dead_lease"),
            "to_reconcile": (i.preview or {}).get("to_reconcile") or [],
        }
    decision = report.get("decision") or {}
    rebuilt = report.get("rebuilt") or {}
    action = decision.get("action") or job.get("action", "")
    reconciliation = []
    for r in report.get("reconciliation") or []:
        evidence = r.get("evidence")
        reconciliation.append(
            {
                "effect": r.get("effect", ""),
                "tool": r.get("tool", ""),
                "action": r.get("action", ""),
                "key": r.get("idempotency_key", ""),
                "was": r.get("was", ""),
                "outcome": r.get("outcome", ""),
                "external_ref": r.get("external_ref") or "",
                "already": bool(r.get("already")),
                "evidence": [(k, shown(v)) for k, v in evidence.items()]
                if isinstance(evidence, dict)
                else ([("", shown(evidence))] if evidence else []),
                "note": r.get("why")
                or r.get("detail")
                or ("already settled before the recovery" if r.get("already") else ""),
            }
        )
    versions = report.get("versions") or {}
    return base_view | {
        "pending": False,
        "badge": action,
        "action": action,
        "why": decision.get("why") or job.get("why", ""),
        "safe": action in ("redrive", "retry", "compensate"),
        "state": job.get("state", ""),
        "next_state": decision.get("next_state", ""),
        "next": decision.get("next", ""),
        "from_checkpoint": decision.get("from_checkpoint"),
        "refused_fencing_token": decision.get("refused_fencing_token"),
        "plan_id": decision.get("plan_id"),
        "trigger": report.get("trigger", ""),
        "dead_lease": report.get("dead_lease"),
        "checkpoint_rebuilt": rebuilt.get("checkpoint"),
        "history_after": len(rebuilt.get("history_after_checkpoint") or []),
        "effects_after": rebuilt.get("effects_after_checkpoint") or [],
        "steps_to_rerun": rebuilt.get("steps_to_rerun") or [],
        "history": report.get("history") or {},
        "checkpoint": report.get("checkpoint") or {},
        "versions": {
            "runnable": versions.get("runnable"),
            "note": versions.get("note", ""),
            "unknown": bool(versions.get("unknown")),
            "differences": [
                {"key": d.get("key"), "then": shown(d.get("then")), "now": shown(d.get("now"))}
                for d in versions.get("differences") or []
            ],
        },
        "reconciliation": reconciliation,
        "unresolved_after": report.get("unresolved_after") or [],
        "attempts": report.get("attempts") or {},
        "rules": report.get("rules") or [],
    }


def run_reports(run: Run, interventions: list[Intervention]) -> dict[str, Any]:
    """For the run page: every plan of the run (newest first), each listed intervention's report, and
    the latest recovery (the recovery gate)."""
    plans = [compensation_view(p) for p in compensation_plans(run=run)]
    by_intervention: dict[Any, list[dict[str, Any]]] = {}
    for plan in plans:
        by_intervention.setdefault(UUID(plan["intervention"]), []).append(plan)
    reports = {i.pk: report_for(i, by_intervention) for i in interventions}
    latest_recovery = next((reports[i.pk] for i in interventions if i.kind == "recover"), None)
    return {"plans": plans, "reports": reports, "recovery": latest_recovery}
