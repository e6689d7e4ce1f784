"""Receipt cards: what an intervention did, the answer first (console/cards.py draws the pieces), and
the receipt's permalink page /receipts/<intervention id>/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.cards import (
    answer,
    card,
    cell,
    checkpoint_text,
    children_table,
    committed_table,
    effect_cell,
    grants_table,
    in_flight_table,
    row,
    table,
    timer_cell,
    unresolved_table,
)
from console.common import (
    ConsoleRequest,
    console_view,
    kind_label,
    present,
    visible_run_or_404,
)
from console.reports import report_for
from interventions.models import Intervention


def _state_line(r: dict[str, Any]) -> str:
    state = r.get("state")
    waiting = r.get("waiting_for")
    return f"The run is now {state}" + (
        f": waiting for {waiting.removeprefix('the ')}" if waiting else ""
    )


def pause_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    timers = r.get("timers") or []
    suspended = r.get("authority_suspended") or []
    return [
        answer(
            "stops", "New effects", f"{r.get('new_effects', 'denied')} ·", at=r.get("paused_at")
        ),
        answer(
            "may_still_complete",
            "May still complete",
            "its outcome is recorded after the pause" if r.get("in_flight_effects") else "",
            in_flight_table(r.get("in_flight_effects") or []),
            empty="nothing was in flight",
        ),
        answer(
            "children",
            "Children",
            "",
            children_table(r.get("children_listed") or []),
            empty="no child runs",
        ),
        answer(
            "authority",
            "Authority still active",
            ("suspended: " + ", ".join(suspended)) if suspended else "",
            grants_table(r.get("authority") or []),
            empty="no active grant",
        ),
        answer(
            "timers",
            "Timers keep running",
            "",
            table(
                ["timer", "fires", "status"],
                [
                    row(
                        cell("code", t["name"]),
                        timer_cell(t),
                        cell("status", t["status"]),
                    )
                    for t in timers
                ],
            ),
            empty="no pending timer",
        ),
        answer("resume_from", "A resume starts from", checkpoint_text(r.get("resume_from"))),
    ]


def resume_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        answer("resume_from", "Runs again from", checkpoint_text(r.get("resume_from"))),
        answer(
            "checks",
            "Revalidation",
            "the report below lists each check as pass or fail and the steps that run again",
        ),
    ]


def cancel_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        answer("stops", "New effects", f"{r.get('new_effects', '')} ·", at=r.get("cancelled_at")),
        answer(
            "committed",
            "Still committed",
            "cancel never marks them undone; compensate to repair them",
            committed_table(r.get("committed_effects") or []),
            empty="nothing had committed",
        ),
        answer(
            "may_still_complete",
            "May still complete",
            "",
            in_flight_table(r.get("in_flight_effects") or []),
            empty="nothing in flight",
        ),
        answer(
            "children", "Children", "", children_table(r.get("children") or []), "no child runs"
        ),
    ]


def retry_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    prev = r.get("previous_attempt") or {}
    return [
        answer(
            "next_attempt",
            "New attempt",
            f"attempt {r.get('next_attempt')}; {r.get('note', '')}; claimable",
            at=r.get("claimable_after"),
        ),
        answer("from_checkpoint", "From", checkpoint_text(r.get("from_checkpoint"))),
        answer(
            "previous",
            "Previous attempt",
            f"attempt {prev.get('number')} ({prev.get('failure_class') or 'no failure class'})"
            if prev
            else "",
            empty="none",
        ),
    ]


def compensate_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's table with each step's progress is the report below the card: not drawn twice."""
    plan = r.get("plan") or {}
    steps, called_out = plan.get("steps") or [], plan.get("called_out") or []
    irreversible = [c for c in called_out if c.get("irreversible")]
    return [
        answer(
            "plan",
            "Plan",
            f"{len(steps)} compensation{'s' if len(steps) != 1 else ''} in reverse order: "
            + ", ".join(f"{s['compensation']['tool']}:{s['compensation']['action']}" for s in steps)
            if steps
            else "",
            empty="nothing to compensate",
        ),
        answer(
            "irreversible",
            "Irreversible",
            ", ".join(f"{c['tool']}:{c['action']} ({c['idempotency_key']})" for c in irreversible)
            + " — stays committed"
            if irreversible
            else "",
            empty="none",
            tone="bad" if irreversible else "",
        ),
    ]


def transfer_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    records = r.get("records") or []
    may = r.get("who_may_now") or {}
    return [
        answer(
            "moved",
            "Moved",
            "",
            table(
                ["facet", "from", "to"],
                [
                    row(
                        cell("text", m["facet"].replace("_", " ")),
                        cell("value", m["from"]),
                        cell("value", m["to"]),
                    )
                    for m in records
                ],
            ),
        ),
        answer(
            "who_may_now",
            "Who may now",
            "",
            table(
                ["action", "may act", "by override"],
                [
                    row(
                        cell("text", action),
                        cell("text", ", ".join(v.get("may_act") or []) or "nobody directly"),
                        cell("text", ", ".join(v.get("by_override") or []) or "—"),
                    )
                    for action, v in may.items()
                ],
            ),
        ),
        answer(
            "unresolved",
            "Unresolved at handoff",
            "",
            unresolved_table(r.get("unresolved_effects") or []),
            empty="no effect in flight or unknown",
        ),
        answer(
            "approvals",
            "Pending decisions at handoff",
            "",
            table(
                ["approval", "action", "status"],
                [
                    row(cell("id", a["id"]), effect_cell(a), cell("status", a["status"]))
                    for a in r.get("pending_approvals") or []
                ],
            ),
            empty="no pending approval",
        ),
        answer("execution", "Execution", r.get("execution_note", "")),
    ]


def recover_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    lease = r.get("dead_lease") or {}
    return [
        answer("fencing", "Zombie writes", r.get("fencing", "")),
        answer(
            "dead_lease",
            "Lost worker",
            f"{lease.get('worker')} (fencing token {lease.get('fencing_token')})" if lease else "",
            empty="none",
        ),
        answer(
            "prefer", "Preferred next action", f"{r.get('prefer')}; the recovery gate below decides"
        ),
    ]


def reconcile_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    job = r.get("job") or {}
    results = job.get("reconciled") or []
    return [
        answer(
            "asked",
            "Asked of the world",
            "",
            unresolved_table(r.get("unresolved_effects") or []),
            empty="nothing was unresolved",
        ),
        answer(
            "answers",
            "Answers",
            f"{job.get('still_unknown')} still unknown" if results else "",
            table(
                ["effect", "outcome", "external ref"],
                [
                    row(
                        cell("id", x.get("effect")),
                        cell("status", x.get("outcome")),
                        cell("text", x.get("external_ref") or "—"),
                    )
                    for x in results
                ],
            ),
            empty="the job has not answered yet",
        ),
    ]


def approval_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    a, shown = r.get("approval") or {}, r.get("shown") or {}
    return [
        answer(
            "decision",
            "Decision",
            f"{a.get('decision')} {a.get('tool')}:{a.get('action')} by {a.get('decided_by')} ({a.get('role')})",
            at=a.get("decided_at"),
        ),
        answer("binding", "Binding", r.get("binding", "")),
        answer(
            "args",
            "Args shown",
            "",
            table(["args"], [row(cell("value", shown.get("args") or {}))]),
            empty="no args",
        ),
        answer("delivery", "Delivery", r.get("delivery", "")),
    ]


def authority_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        answer(
            "changed",
            f"Grants {r.get('change')}d",
            "",
            grants_table(r.get("changed") or [], was=True),
            empty="none",
        ),
        answer("declarations", "New declarations", r.get("new_declarations", "")),
        answer(
            "may_still_complete",
            "Already dispatched",
            r.get("cannot_recall") or "",
            in_flight_table(r.get("in_flight_effects") or []),
            empty="nothing in flight under these grants",
        ),
    ]


def close_receipt(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        answer(
            "committed",
            "Stays committed",
            "closed: nothing further happens to the run",
            committed_table(r.get("committed_effects") or []),
            empty="nothing committed",
        )
    ]


RECEIPTS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "pause": pause_receipt,
    "resume": resume_receipt,
    "cancel": cancel_receipt,
    "retry": retry_receipt,
    "compensate": compensate_receipt,
    "transfer": transfer_receipt,
    "recover": recover_receipt,
    "reconcile": reconcile_receipt,
    "approve": approval_receipt,
    "reject": approval_receipt,
    "revoke_authority": authority_receipt,
    "suspend_authority": authority_receipt,
    "restore_authority": authority_receipt,
    "close": close_receipt,
}


class _Read(dict):
    """A receipt that remembers which keys the card read, so the folded rest shows only the others."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


# On the receipt's header line already, or drawn by the job's report below the card.
NOT_REPEATED = {
    "kind",
    "issued_by",
    "role",
    "reason",
    "scope",
    "override",
    "override_reason",
    "job",
}


def receipt_card(i: Intervention) -> dict[str, Any]:
    r = _Read(i.receipt or {})
    builder = RECEIPTS.get(i.kind)
    answers = builder(r) if builder else []
    who = answer(
        "who",
        "Who and why",
        f"{i.actor_label} ({i.role or 'no role'}): {i.reason} ·",
        at=i.created_at,
    )
    if i.override:
        who["text"] = f"{i.actor_label} ({i.role}), overriding: {i.override_reason} · {i.reason} ·"
    rest = {k: v for k, v in r.items() if k not in r.read and k not in NOT_REPEATED}
    more = [answer("recorded", "Also recorded", "", table(["receipt"], [row(cell("value", rest))]))]
    out = card(
        "receipt-card",
        f"Receipt: {kind_label(i.kind)}",
        _state_line(r) if r.get("state") else f"Status {i.status}",
        [*answers, who],
        more=more if rest else [],
    )
    return out | {"kind": i.kind, "id": str(i.pk), "run_id": str(i.run_id), "status": i.status}


def receipt_context(i: Intervention) -> dict[str, Any]:
    return {
        "i": i,
        "card": receipt_card(i),
        "label": kind_label(i.kind),
        "rep": report_for(i),
    }


@console_view
@require_GET
def receipt_page(request: ConsoleRequest, intervention_id: UUID) -> HttpResponse:
    """The receipt's permalink: the card and its job report, for anyone who may see the run."""
    intervention = Intervention.objects.filter(pk=intervention_id).first()
    if intervention is None:
        raise Http404("no such receipt")
    run = visible_run_or_404(request.actor, intervention.run_id)
    return render(
        request,
        "console/intervention_receipt.html",
        receipt_context(intervention)
        | {"run": run, "job": present((intervention.receipt or {}).get("job"))},
    )
