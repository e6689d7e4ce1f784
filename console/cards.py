"""Preview cards: each contract's preview as the answers an operator needs, in the order they need
them (docs/operator/scenarios.md), drawn by console/templates/console/intervention_card.html.

A card is plain data: a verdict line, the blocking problems (Confirm is disabled while any is shown),
the answers -- each a label with a sentence and/or a small table -- and folded extras. Nothing is
computed here that the preview did not record; rows are only chosen and ordered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from interventions.registry import redact

# --- the pieces a card is made of -----------------------------------------------------------------


def cell(t: str, v: Any, **extra: Any) -> dict[str, Any]:
    """One table cell: t is text | code | id | time | status | value | flag | yesno."""
    return {"t": t, "v": v, **extra}


def timer_cell(t: dict[str, Any]) -> dict[str, Any]:
    """A timer's fire time, or what core.times says when the stored one could not be read."""
    if t.get("unreadable"):
        return cell("text", f"unreadable stored time ({t['unreadable']})")
    return cell("time", t.get("fire_at"))


def table(cols: list[str], rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"cols": cols, "rows": rows}


def row(*cells: dict[str, Any], mark: str = "", testid: str = "") -> dict[str, Any]:
    return {"cells": list(cells), "mark": mark, "testid": testid}


def answer(
    key: str,
    label: str,
    text: str = "",
    tbl: dict[str, Any] | None = None,
    empty: str = "none",
    items: list[str] | None = None,
    tone: str = "",
    at: Any = None,
) -> dict[str, Any]:
    """One answer line. ``empty`` is said when there is neither text, table rows nor items; ``at``
    is a time drawn after the text (relative, absolute on hover)."""
    has = bool(text or items or at or (tbl and tbl["rows"]))
    return {
        "key": key,
        "label": label,
        "text": text,
        "table": tbl if tbl and tbl["rows"] else None,
        "items": items or [],
        "empty": "" if has else empty,
        "tone": tone,
        "at": at,
    }


def card(
    testid: str,
    title: str,
    verdict: str,
    answers: list[dict[str, Any]],
    *,
    tone: str = "",
    blocking: list[str] | None = None,
    more: list[dict[str, Any]] | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "testid": testid,
        "title": title,
        "verdict": verdict,
        "tone": tone,
        "blocking": blocking or [],
        "warnings": warnings or [],
        "answers": answers,
        "more": more or [],
    }


# --- rows every card reuses -------------------------------------------------------------------------


def effect_cell(e: dict[str, Any]) -> dict[str, Any]:
    return cell("code", f"{e.get('tool', '')}:{e.get('action', '')}")


def in_flight_table(effects: list[dict[str, Any]]) -> dict[str, Any]:
    return table(
        ["effect", "idempotency key", "step", "in flight since"],
        [
            row(
                effect_cell(e),
                cell("code", e.get("idempotency_key")),
                cell("code", e.get("step")),
                cell("time", e.get("declared_at")),
                testid="in-flight",
            )
            for e in effects
        ],
    )


def unresolved_table(effects: list[dict[str, Any]]) -> dict[str, Any]:
    return table(
        ["effect", "idempotency key", "step", "status"],
        [
            row(
                effect_cell(e),
                cell("code", e.get("idempotency_key")),
                cell("code", e.get("step")),
                cell("status", e.get("status")),
            )
            for e in effects
        ],
    )


def committed_table(effects: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for e in effects:
        comp = e.get("compensation") or {}
        undo = (
            "irreversible"
            if e.get("irreversible")
            else (f"{comp.get('tool') or e.get('tool')}:{comp.get('action')}" if comp else "none")
        )
        rows.append(
            row(
                effect_cell(e),
                cell("code", e.get("idempotency_key")),
                cell("text", e.get("external_ref") or "—"),
                cell("code" if comp else "text", undo),
                cell("status", e.get("compensation_status") or "committed"),
                mark="irreversible" if e.get("irreversible") else "",
            )
        )
    return table(["effect", "idempotency key", "external ref", "compensation", "status"], rows)


def children_table(children: list[dict[str, Any]]) -> dict[str, Any]:
    return table(
        ["child run", "agent", "state", "in scope", "changes", "note"],
        [
            row(
                cell("id", c.get("id")),
                cell("text", c.get("agent")),
                cell("status", c.get("state")),
                cell("yesno", c.get("in_scope")),
                cell("yesno", c.get("will_change")),
                cell("text", c.get("note") or ""),
                testid="child",
            )
            for c in children
        ],
    )


def grants_table(grants: list[dict[str, Any]], was: bool = False) -> dict[str, Any]:
    cols = ["scope", "status", "expires", "grant"]
    rows = []
    for g in grants:
        status = f"{g['was']} → {g['status']}" if was and g.get("was") else g.get("status")
        rows.append(
            row(
                cell("code", g.get("scope")),
                cell("status", status, css=g.get("status")),
                cell("time", g.get("expires_at")),
                cell("id", g.get("id")),
                mark="cascade" if g.get("cascaded") else "",
            )
        )
    return table(cols, rows)


def checkpoint_text(cp: dict[str, Any] | None) -> str:
    if not cp:
        return "no checkpoint: the next attempt starts from the beginning"
    return f"checkpoint {cp.get('seq')} · {cp.get('step')}"


def checkpoint_table(cp: dict[str, Any] | None) -> dict[str, Any] | None:
    """The checkpoint named in one row; its recorded state folds (never pasted whole)."""
    if not cp:
        return None
    return table(
        ["seq", "step", "taken", "state"],
        [
            row(
                cell("text", cp.get("seq")),
                cell("code", cp.get("step")),
                cell("time", cp.get("created_at")),
                cell("value", cp.get("state"), fold=True),
            )
        ],
    )


def verdict(p: dict[str, Any]) -> tuple[str, str, list[str], list[str]]:
    """(text, tone, refusals, states): the text is followed by the states' badges."""
    if p.get("allowed"):
        if p["state"] != p["next_state"]:
            return "Allowed:", "", [], [p["state"], p["next_state"]]
        return "Allowed: the run stays", "", [], [p["state"]]
    refusal = f"{p['kind'].replace('_', ' ')} is not allowed while the run is {p['state']}"
    return "Not allowed while the run is", "bad", [refusal], [p["state"]]


# --- one builder per contract ---------------------------------------------------------------------


def pause_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    in_flight = p.get("in_flight_effects") or []
    timers = p.get("timers") or []
    deadline = p.get("deadline")
    timer_rows = [
        row(cell("code", t["name"]), timer_cell(t), cell("status", t["status"])) for t in timers
    ]
    if deadline:
        timer_rows.append(
            row(cell("text", "run deadline"), cell("time", deadline["deadline"]), cell("text", ""))
        )
    return [
        answer("stops", "What stops", p.get("stops", "")),
        answer(
            "may_still_complete",
            "May still complete",
            f"{len(in_flight)} effect{'s' if len(in_flight) != 1 else ''} already dispatched; "
            "outcomes are recorded after the pause"
            if in_flight
            else "",
            in_flight_table(in_flight),
            empty="nothing in flight: the pause completes at once",
        ),
        answer(
            "children",
            "Children",
            "the pause reaches them" if p.get("scope") == "tree" else "this run only",
            children_table(p.get("children") or []),
            empty="no child runs",
        ),
        answer(
            "authority",
            "Authority",
            p.get("authority_change", ""),
            grants_table(p.get("authority") or []),
        ),
        answer(
            "timers",
            "Timers keep running",
            "",
            table(["timer", "fires", "status"], timer_rows),
            empty="no pending timer or deadline",
        ),
        answer("resume_from", "A resume starts from", checkpoint_text(p.get("resume_from"))),
    ]


CHECK_LABELS = {
    "boundary": "Checkpoint boundary",
    "versions": "Versions",
    "assumptions": "Assumptions",
    "unknown_effects": "Unknown effects",
    "authority": "Authority now",
    "replay": "Steps that run again",
}


def checks_table(report: dict[str, Any]) -> dict[str, Any]:
    return table(
        ["check", "result", "what it found"],
        [
            row(
                cell("text", CHECK_LABELS.get(c["name"], c["name"])),
                cell("status", "pass" if c["ok"] else "fail"),
                cell("text", c.get("summary", "")),
                mark="" if c["ok"] else "fail",
                testid=f"check-{c['name']}",
            )
            for c in report.get("checks") or []
        ],
    )


def replay_table(report: dict[str, Any]) -> dict[str, Any]:
    replay = next((c for c in report.get("checks") or [] if c["name"] == "replay"), None)
    rows = []
    for step in (replay or {}).get("details") or []:
        for e in step.get("effects") or []:
            rows.append(
                row(
                    cell("code", step.get("step")),
                    effect_cell(e),
                    cell("code", e.get("idempotency_key")),
                    cell("status", e.get("status")),
                    cell(
                        "text",
                        "replays the recorded result" if e.get("protected") else "UNPROTECTED",
                    ),
                    mark="" if e.get("protected") else "fail",
                )
            )
    return table(["step", "effect", "idempotency key", "recorded", "when it runs again"], rows)


def resume_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    fired = p.get("timers_fired_while_paused") or []
    report = p.get("dry_run") or {}
    failing = report.get("failing") or []
    if report.get("error"):
        checks = answer("checks", "Checks now", f"could not check now: {report['error']}")
    else:
        checks = answer(
            "checks",
            "Checks now",
            ("every check passes now" if not failing else "failing now: " + ", ".join(failing))
            + "; the revalidation job checks again on confirm"
            + (" and your override is used for a failing check" if p.get("override") else ""),
            checks_table(report),
            tone="bad" if failing else "",
        )
    return [
        checks,
        answer(
            "runs_again",
            "Runs again",
            f"from {checkpoint_text(p.get('resume_from'))}",
            replay_table(report),
            empty="no step with effects runs again",
        ),
        answer(
            "timers_fired",
            "Timers fired while paused",
            "",
            table(
                ["timer", "fired"],
                [row(cell("code", t["name"]), timer_cell(t)) for t in fired],
            ),
            empty="none: delivered on resume if any fire",
        ),
    ]


def cancel_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        answer("stops", "What stops", p.get("stops", "")),
        answer(
            "committed",
            "Stays committed",
            p.get("note", ""),
            committed_table(p.get("committed_effects") or []),
            empty="nothing committed yet",
        ),
        answer(
            "may_still_complete",
            "May still complete",
            "",
            in_flight_table(p.get("in_flight_effects") or []),
            empty="nothing in flight",
        ),
        answer(
            "children", "Children", "", children_table(p.get("children") or []), "no child runs"
        ),
    ]


def retry_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    last = p.get("last_attempt") or {}
    policy = p.get("policy") or {}
    cp = p.get("from_checkpoint")
    return [
        answer(
            "next_attempt",
            "New attempt",
            f"attempt {p.get('next_attempt')} of {policy.get('max_attempts', '?')}, "
            f"claimable after {p.get('backoff_s', 0)} s backoff; it gets its own id when claimed",
        ),
        answer(
            "from_checkpoint",
            "From",
            checkpoint_text(cp) if isinstance(cp, dict) or cp is None else f"checkpoint {cp}",
        ),
        answer("keys", "Idempotency keys", p.get("idempotency_keys", "")),
        answer(
            "last_attempt",
            "Previous attempt",
            f"attempt {last.get('number')} ended with failure class "
            f"{last.get('failure_class') or 'none recorded'}"
            if last
            else "",
            empty="no attempt yet",
        ),
    ]


def compensate_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    plan = p.get("plan") or {}
    steps, called_out = plan.get("steps") or [], plan.get("called_out") or []
    merged = sorted(
        [("step", s) for s in steps] + [("out", c) for c in called_out],
        key=lambda pair: pair[1].get("declared_at", ""),
        reverse=True,
    )
    rows = []
    for what, e in merged:
        if what == "step":
            comp = e.get("compensation") or {}
            rows.append(
                row(
                    cell("text", e["position"]),
                    effect_cell(e),
                    cell("code", e.get("idempotency_key")),
                    cell("code", f"{comp.get('tool')}:{comp.get('action')}"),
                    cell(
                        "value", redact(comp.get("tool") or "", comp.get("args") or {}), fold=True
                    ),
                    testid="plan-step",
                )
            )
        else:
            rows.append(
                row(
                    cell("text", "—"),
                    effect_cell(e),
                    cell("code", e.get("idempotency_key")),
                    cell("flag", "irreversible" if e.get("irreversible") else "not undone"),
                    cell("text", e.get("why", "")),
                    mark="irreversible" if e.get("irreversible") else "called-out",
                    testid="plan-called-out",
                )
            )
    irreversible = [c for c in called_out if c.get("irreversible")]
    skipped = plan.get("skipped") or []
    return [
        answer(
            "plan",
            "Plan",
            f"{len(steps)} compensation{'s' if len(steps) != 1 else ''}, newest first "
            f"(the reverse of the order the run performed them)",
            table(["#", "effect", "idempotency key", "undo with", "args / why not"], rows),
            empty="nothing committed to compensate",
        ),
        answer(
            "irreversible",
            "Irreversible",
            ", ".join(f"{c['tool']}:{c['action']} ({c['idempotency_key']})" for c in irreversible)
            + " — stays committed; nothing can undo it"
            if irreversible
            else "",
            empty="none",
            tone="bad" if irreversible else "",
        ),
        answer(
            "skipped",
            "Already compensated",
            ", ".join(f"{c['tool']}:{c['action']}" for c in skipped),
            empty="none",
        ),
        answer(
            "retries",
            "On failure",
            "each step is retried up to {max_attempts} times with backoff from {backoff_s} s; "
            "the plan ends completed, partially_failed or failed".format(
                **{"max_attempts": "?", "backoff_s": "?", **(p.get("options") or {})}
            ),
        ),
    ]


def transfer_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    current, proposed = p.get("current") or {}, p.get("proposed") or {}
    facets = p.get("facets") or []
    lease = current.get("execution_lease") or {}
    now_text = {
        "assignment": current.get("assignment"),
        "decision_authority": current.get("decision_authority"),
        "execution_lease": (
            f"{lease.get('worker')} (live)"
            if lease.get("live")
            else (lease.get("worker") or "none")
        )
        + (f", pinned to {lease['pinned_to']}" if lease.get("pinned_to") else ""),
    }
    rows = [
        row(
            cell("text", f.replace("_", " ")),
            cell("text", now_text.get(f) or "—"),
            cell("text", (proposed.get(f) or "—") if f in facets else "unchanged"),
            mark="moves" if f in facets else "",
        )
        for f in ("assignment", "decision_authority", "execution_lease")
    ]
    approvals = p.get("pending_approvals") or []
    return [
        answer("facets", "Moves", "", table(["facet", "now", "after"], rows)),
        answer(
            "unresolved",
            "Unresolved at handoff",
            "",
            unresolved_table(p.get("unresolved_effects") or []),
            empty="no effect in flight or unknown",
        ),
        answer(
            "approvals",
            "Pending decisions",
            "",
            table(
                ["approval", "action", "status"],
                [
                    row(cell("id", a["id"]), effect_cell(a), cell("status", a["status"]))
                    for a in approvals
                ],
            ),
            empty="no pending approval",
        ),
        answer(
            "authority",
            "Grants handed over as they are",
            "",
            grants_table(p.get("authority_handed_over") or []),
        ),
    ]


def recover_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    lease = p.get("dead_lease") or {}
    versions = p.get("versions") or {}
    diffs = versions.get("differences") or []
    return [
        answer(
            "dead_lease",
            "Lost worker",
            f"{lease.get('worker')} (fencing token {lease.get('fencing_token')}, "
            f"lease {lease.get('status')}); its writes will be refused"
            if lease
            else "",
            table(
                ["worker", "lease expired", "why"],
                [
                    row(
                        cell("text", lease.get("worker")),
                        cell("time", lease.get("expires_at")),
                        cell("text", lease.get("end_reason") or ""),
                    )
                ]
                if lease
                else [],
            ),
            empty="no lease was ever granted",
        ),
        answer(
            "to_reconcile",
            "Asked of the world first",
            "",
            unresolved_table(p.get("to_reconcile") or []),
            empty="nothing to reconcile",
        ),
        answer(
            "rebuild_from",
            "State rebuilt from",
            checkpoint_text(p.get("checkpoint")) + ", plus the history after it",
            checkpoint_table(p.get("checkpoint")),
        ),
        answer(
            "versions",
            "Versions",
            versions.get("note", ""),
            table(
                ["version", "pinned", "workers now"],
                [
                    row(cell("code", d["key"]), cell("value", d["then"]), cell("value", d["now"]))
                    for d in diffs
                ],
            ),
            tone="bad" if versions.get("runnable") is False else "",
        ),
        answer(
            "prefer",
            "Preferred next action",
            f"{p.get('prefer')} — the first matching rule decides, and says why it is safe",
        ),
    ]


def reconcile_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        answer(
            "to_reconcile",
            "Asked of the world",
            p.get("how", ""),
            unresolved_table(p.get("unresolved_effects") or []),
        ),
    ]


def approval_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    shown = p.get("shown") or {}
    return [
        answer(
            "decision",
            "Decides",
            f"{shown.get('tool')}:{shown.get('action')} in this attempt, once — "
            f"approval {p.get('approval_status')}",
        ),
        answer(
            "args",
            "With exactly these args",
            "",
            table(["args"], [row(cell("value", shown.get("args") or {}))]),
            empty="no args",
        ),
        answer(
            "requested",
            "Requested",
            f"by {shown.get('requested_by')}: {shown.get('request_reason') or 'no reason given'}",
        ),
        answer(
            "deadline",
            "Deadline",
            "",
            table(
                ["deadline", "needs role"],
                [
                    row(
                        cell("time", shown.get("deadline")),
                        cell("text", shown.get("required_role")),
                    )
                ],
            ),
        ),
        answer("delivery", "Delivery", p.get("delivery", "")),
    ]


def authority_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    changing = p.get("will_change") or []
    cascade = p.get("cascade") or []
    return [
        answer(
            "grants",
            f"Grants to {p.get('change')}",
            f"{len(changing)} grant(s), {len(cascade)} of them delegated from the selected ones"
            if changing
            else "",
            grants_table(changing),
            empty="no grant matches",
        ),
        answer("declarations", "New declarations", p.get("new_declarations", "")),
        answer(
            "may_still_complete",
            "Already dispatched",
            p.get("cannot_recall") or "",
            in_flight_table(p.get("in_flight_effects") or []),
            empty="nothing in flight under these grants",
        ),
    ]


def close_card(p: dict[str, Any]) -> list[dict[str, Any]]:
    unresolved = p.get("unresolved_effects") or []
    return [
        answer("final", "Final", p.get("note", "")),
        answer(
            "committed",
            "Stays committed",
            "",
            committed_table(p.get("committed_effects") or []),
            empty="nothing committed",
        ),
        answer(
            "unresolved",
            "Left unresolved",
            "",
            unresolved_table(unresolved),
            empty="nothing in flight or unknown",
            tone="bad" if unresolved else "",
        ),
    ]


BUILDERS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "pause": pause_card,
    "resume": resume_card,
    "cancel": cancel_card,
    "retry": retry_card,
    "compensate": compensate_card,
    "transfer": transfer_card,
    "recover": recover_card,
    "reconcile": reconcile_card,
    "approve": approval_card,
    "reject": approval_card,
    "revoke_authority": authority_card,
    "suspend_authority": authority_card,
    "restore_authority": authority_card,
    "close": close_card,
}


def blocking_problems(p: dict[str, Any]) -> list[str]:
    """What the service would refuse on confirm, as the preview already knows it."""
    kind, out = p.get("kind", ""), []
    if kind == "retry":
        out += [pr["detail"] for pr in p.get("problems") or []]
    if kind == "compensate" and p.get("blocked"):
        n = len(p.get("unresolved_effects") or [])
        out.append(f"reconcile first: {n} effect(s) in flight or unknown")
    if kind in ("transfer", "revoke_authority", "suspend_authority", "restore_authority"):
        out += list(p.get("blocked_by") or [])
    if kind.endswith("_authority") and not p.get("will_change") and not p.get("blocked_by"):
        out.append(f"no grant to {p.get('change')}: choose an active grant or another scope")
    if kind in ("approve", "reject") and p.get("approval_status") not in (None, "pending"):
        out.append(f"the approval is already {p.get('approval_status')}")
    return out


def preview_card(p: dict[str, Any], dry_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The card for one preview (the dict interventions.base.preview returns). ``dry_run``: for a
    resume, the revalidation report as it would come out now (console/interventions.py)."""
    kind = p["kind"]
    if dry_run is not None:
        p = p | {"dry_run": dry_run}
    text, tone, refused, states = verdict(p)
    builder = BUILDERS.get(kind)
    answers = builder(p) if builder else []
    more = []
    if kind == "recover" and p.get("rules"):
        more.append(answer("rules", "The rules, in order", "", items=list(p["rules"])))
    if kind == "retry" and p.get("policy"):
        more.append(
            answer(
                "policy", "Retry policy", "", table(["policy"], [row(cell("value", p["policy"]))])
            )
        )
    return {"kind": kind, "states": states} | card(
        "preview-card",
        "Preview — nothing has changed yet",
        text,
        answers,
        tone=tone,
        blocking=refused + blocking_problems(p),
        more=more,
    )
