"""The pieces a card is made of: plain data that console/templates/console/intervention_card.html draws. Each
contract builds its preview card and its receipt from them (interventions/<kind>.py, registered in
interventions/plugins.py); console/cards.py and console/receipts.py only assemble and render.

A card is a verdict line, the blocking problems (Confirm is disabled while any is shown), the answers
-- each a label with a sentence and/or a small table -- and folded extras. Nothing is computed here
that the preview did not record; rows are only chosen and ordered.
"""

from __future__ import annotations

from typing import Any


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


# --- rows many cards reuse ---------------------------------------------------------------------------


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
