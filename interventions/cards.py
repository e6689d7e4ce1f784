"""The pieces a card is made of: plain data that console/templates/console/intervention_card.html draws. Each
contract builds its preview card and its receipt from them (interventions/<kind>.py, registered in
interventions/plugins.py); console/cards.py and console/receipts.py only assemble and render.

A card is a verdict line, the blocking problems (Confirm is disabled while any is shown), the answers
-- each a label with a sentence and/or a small table -- and folded extras. Nothing is computed here
that the preview did not record; rows are only chosen and ordered.
"""

from __future__ import annotations

from typing import Any

from interventions.selectors import progress_text


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
    link: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One answer line. ``empty`` is said when there is neither text, table rows nor items; ``at``
    is a time drawn after the text (relative, absolute on hover); ``link`` (href, words) follows."""
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
        "link": {"href": link[0], "text": link[1]} if link else None,
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


# --- a receipt's headline: the truth now, in words (Console.now; console/receipts.py draws it) -------


def clock(value: Any) -> str:
    """An ISO time as the wall-clock time an operator reads ("23:14:05 UTC"); "" if there is none."""
    from datetime import datetime

    if not value:
        return ""
    try:
        when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    return f"{when:%H:%M:%S} UTC"


def duration(seconds: Any) -> str:
    s = max(float(seconds or 0), 0.0)
    if s < 60:
        return f"{s:.0f} s" if s >= 10 or s == int(s) else f"{s:.1f} s"
    if s < 3600:
        return f"{s // 60:.0f} min"
    return f"{s // 3600:.0f} h {s % 3600 // 60:.0f} min"


def effect_words(e: dict[str, Any]) -> str:
    return f"{e.get('tool', '')}:{e.get('action', '')}"


def drained_text(drained: dict[str, Any], noun: str) -> str:
    """ "drained at 23:14:05 UTC: payments:charge committed 2 s after the pause"."""
    parts = [
        f"{effect_words(e)} {e.get('status')} {duration(e.get('after_s'))} after the {noun}"
        for e in drained.get("settled") or []
    ]
    parts += [
        f"{effect_words(e)} still {e.get('status')}: reconcile it"
        for e in drained.get("unresolved") or []
    ]
    said = "; ".join(parts) if parts else "nothing was in flight"
    return f"drained at {clock(drained.get('drained_at') or drained.get('at'))}: {said}"


def draining_text(in_flight: list[dict[str, Any]], now_iso: str | None = None) -> str:
    """ "waiting for 1 effect in flight: payments:charge (in flight 32 s)"."""
    from django.utils import timezone
    from django.utils.dateparse import parse_datetime

    if not in_flight:
        return "waiting for the worker to stop at a step boundary"
    now = timezone.now()
    ages = []
    for e in in_flight:
        declared = parse_datetime(str(e.get("declared_at") or ""))
        age = f" (in flight {duration((now - declared).total_seconds())})" if declared else ""
        ages.append(effect_words(e) + age)
    n = len(in_flight)
    return f"waiting for {n} effect{'s' if n != 1 else ''} in flight: " + ", ".join(ages)


def state_now(r: Any, now: Any) -> str:
    """The default headline: the run's state now, and the follow-up job while it runs."""
    line = f"The run is now {str(now.get('state', '')).replace('_', ' ')}"
    if now.get("status") == "pending":
        line += f"; its {(now.get('job') or {}).get('kind') or 'follow-up'} job is running"
    return line


def stopped_now(now: Any, noun: str, moving: str, stopped: str) -> str:
    """Pause and cancel: "Paused — drained at …" once drained, "Pausing — waiting for …" before."""
    state = now.get("state")
    drained = now.get("drained")
    if drained:
        line = f"{drained.get('state', stopped).capitalize()} — {drained_text(drained, noun)}"
        if state != drained.get("state"):
            line += f". The run is now {str(state).replace('_', ' ')}"
        return line
    if state == moving:
        return f"{moving.capitalize()} — {draining_text(now.get('in_flight') or [])}"
    if state == stopped:
        return f"{stopped.capitalize()} at once: nothing was executing"
    return state_now({}, now)


def paged_text(r: Any, name: str, noun: str) -> str:
    """ "the first 50 of 1,500 children" when a preview or receipt shows only the start of a list
    (interventions/paging.py); empty when it shows all of it."""
    total, shown = r.get(f"{name}_total"), len(r.get(name) or [])
    if not isinstance(total, int) or total <= shown:
        return ""
    return f"the first {shown} of {total:,} {noun}"


def more_link(r: Any, name: str) -> tuple[str, str] | None:
    """Where the console shows the rest of a paged list: a receipt's children page, or the run page's
    tree and ledger (the API links are the receipt's own ``<name>_more``)."""
    api = r.get(f"{name}_more")
    if not isinstance(api, str) or not api.startswith("/api/v1/"):
        return None
    path, _, query = api.removeprefix("/api/v1/").partition("?")
    parts = path.split("/")
    if parts[0] == "interventions" and len(parts) == 3:
        return f"/receipts/{parts[1]}/children/?{query}", "all of them"
    if parts[0] == "runs" and len(parts) == 3:
        anchor = "run-tree" if parts[2] == "tree" else "run-ledger"
        return f"/runs/{parts[1]}/#{anchor}", "all of them, on the run page"
    return None


def children_answer(r: Any, name: str, text: str = "") -> dict[str, Any]:
    """The children answer of a pause or cancel card: the first page (``r[name]``), how many in all
    (``children_total``), the cascade's progress, and the link to the rest."""
    counted = {**r, "children": r.get(name)}
    said = [t for t in (text, paged_text(counted, "children", "children")) if t]
    if r.get("cascade"):
        said.append(progress_text(r["cascade"]))
    return answer(
        "children",
        "Children",
        " · ".join(said),
        children_table(r.get(name) or []),
        empty="no child runs",
        link=more_link(r, "children"),
    )
