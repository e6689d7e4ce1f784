"""The run page: its sections, the effects ledger page by page, the timeline, and the fragments a
live push sends when one fact changes (console/consumers.py).

One template (console/templates/console/run_detail.html) serves the page, each section alone (``?part=NAME``), each
section as an out-of-band swap, one effect row, and new timeline entries: every fragment a push sends
is a partial of the template that drew the page. Each section is built from its own context builder,
so a push that only needs the header does not read the ledger, the reports or the audit trail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET

from audit.selectors import run_audit_events
from console import timeline as tl
from console.common import (
    ConsoleRequest,
    console_view,
    is_fragment,
    kind_label,
    present,
    visible_run_or_404,
)
from console.reports import receipt_rest, run_reports
from console.run_moved import basis
from core.auth import actor_for_user
from core.roles import PERMISSIONS, ROLES, may, roles_of
from interventions.base import descendants
from interventions.cards import drained_text
from interventions.jobs import attention
from interventions.plugins import REGISTRY
from interventions.selectors import receipt_dict, recent_interventions, running_cascades
from interventions.transfer import holders
from notifications.selectors import run_notifications
from runs.freezes import covering, freeze_dict
from runs.models import Effect, Run
from runs.selectors import (
    discrepancies,
    drain_after,
    effect_count,
    effect_dict,
    effects_by_ids,
    effects_newest,
    recent_checkpoints,
    role_holders,
    run_detail,
    run_grants,
    visible_run,
)
from runs.states import State, allowed_events
from runs.team_scope import team_slug

EFFECTS_PAGE = 50  # a screenful; older effects are a click away ("older", keyset on declared_at)
CHECKPOINTS_SHOWN = 20
AUDIT_LIMIT = 50
INTERVENTIONS_SHOWN = 50


def offered_interventions(
    run: Run, roles: frozenset[str], data: dict[str, Any]
) -> list[tuple[str, str, bool]]:
    """Buttons: the kinds the state table allows from this state AND the user's role may issue.
    The table and the matrix are read, not restated; each contract's ``offered`` only hides a button
    with nothing to act on (no pending approval, no grant to restore). The services check again."""
    allowed = set(allowed_events(run.state))
    out = []
    for kind, contract in REGISTRY.items():
        event = contract.event
        applies = event in allowed if event is not None else run.state != State.CLOSED
        if applies and contract.console.offered(data) and may(roles, kind):
            out.append((kind, kind_label(kind), contract.console.danger))
    return out


def needs_role(action: str, holders: dict[str, list[str]]) -> str:
    """ "needs incident commander or admin — currently: ian, ada": from the role table (core.roles)
    and who holds those roles now, so a hidden action is explained rather than missing."""
    roles = [r for r in ROLES if r in PERMISSIONS.get(action, frozenset())]
    names = list(dict.fromkeys(n for r in roles for n in holders.get(r, [])))
    words = " or ".join(r.replace("_", " ") for r in roles) or "a role no one holds"
    return f"needs {words} — currently: {', '.join(names) if names else 'nobody'}"


def unavailable_interventions(
    run: Run, roles: frozenset[str], data: dict[str, Any]
) -> list[tuple[str, str, str]]:
    """The buttons the state table allows and there is something to act on, but the user's role may
    not issue: shown disabled with the role they need and who holds it (kind, label, needs)."""
    allowed = set(allowed_events(run.state))
    kinds = [
        (kind, contract)
        for kind, contract in REGISTRY.items()
        if (contract.event in allowed if contract.event is not None else run.state != State.CLOSED)
        and not may(roles, kind)
        and contract.console.offered(data)
    ]
    if not kinds:
        return []
    holders = role_holders()
    return [(kind, kind_label(kind), needs_role(kind, holders)) for kind, _ in kinds]


def _tree(run: Run) -> list[dict[str, Any]]:
    """Descendants in depth-first order with their depth, for an indented tree."""
    rows = descendants(run)
    by_parent: dict[Any, list[Run]] = {}
    for child in rows:
        by_parent.setdefault(child.parent_id, []).append(child)
    out: list[dict[str, Any]] = []

    def walk(parent_id: Any, depth: int) -> None:
        for child in by_parent.get(parent_id, []):
            out.append(
                {
                    "id": str(child.pk),
                    "agent": child.agent.name,
                    "state": child.state,
                    "goal": child.goal,
                    "depth": depth,
                    "indent": depth * 1.25,
                }
            )
            walk(child.pk, depth + 1)

    walk(run.pk, 0)
    return out


# --- the effects ledger, newest first, one page at a time -------------------------------------------


def effect_row(e: Effect, now: datetime | None = None) -> dict[str, Any]:
    row = effect_dict(e)
    row["declared"] = e.declared_at
    # Its place in the ledger (newest first, as effects_newest sorts): a pushed row is placed by it.
    row["key"] = f"{e.declared_at.astimezone(UTC):%Y%m%d-%H%M%S-%f}_{e.pk}"
    if e.status == Effect.IN_FLIGHT:
        row["in_flight_s"] = max(int(((now or timezone.now()) - e.declared_at).total_seconds()), 0)
    return row


def effects_cursor(e: Effect) -> str:
    return f"{e.declared_at.isoformat()}_{e.pk}"


def parse_effects_cursor(value: str | None) -> tuple[datetime, UUID] | None:
    if not value or "_" not in value:
        return None
    at, _, pk = value.rpartition("_")
    try:
        when = parse_datetime(at.replace(" ", "+"))
        return (when, UUID(pk)) if when is not None else None
    except ValueError:
        return None


def effects_page(run: Run, before: str | None = None) -> dict[str, Any]:
    """The newest EFFECTS_PAGE effects (or those before the cursor), and the cursor of the next page."""
    cursor = parse_effects_cursor(before)
    rows = effects_newest(run, cursor, EFFECTS_PAGE + 1)
    now = timezone.now()
    more = len(rows) > EFFECTS_PAGE
    rows = rows[:EFFECTS_PAGE]
    return {
        "effects": [effect_row(e, now) for e in rows],
        "effects_next": effects_cursor(rows[-1]) if more and rows else None,
        "effects_older_page": cursor is not None,
    }


# --- section contexts ----------------------------------------------------------------------------


def header_context(run: Run, user, roles: frozenset[str]) -> dict[str, Any]:
    data = run_detail(run)
    data["pending_approvals"] = [a for a in data["approvals"] if a["status"] == "pending"]
    total = effect_count(run)
    return {
        "run": run,
        "data": data,
        "roles": roles,
        "user": user,
        "nav": "runs",
        "team": team_slug(run.team_id),  # docs/operator/teams.md
        "facets": holders(run),
        "failed_jobs": attention(run),  # the banner: a job gave up; what failed and how often
        # Approval notifications of this run whose channel is failing (5 failures in a row).
        "failing_notifications": [n for n in run_notifications(run.pk) if n["channel_failing"]],
        "offered": offered_interventions(run, roles, data),
        "unavailable": unavailable_interventions(run, roles, data),
        "may_reconcile": may(roles, "reconcile"),
        "discrepancies": [effect_dict(e) for e in discrepancies(run)],
        "effects_total": total,
        "basis": basis(run, total, data["unresolved_effects"]),  # an open dialog's "run changed"
        "parent": run.parent,
        "drained": _drained(run),
        # The standing freezes over a scope of the fleet that cover this run (runs/freezes.py).
        "standing_freezes": [freeze_dict(f) for f in covering([run])[run.pk]],
    }


def _drained(run: Run) -> str:
    """The drain that ended the pause or cancel the run is in now, in words (runs/services/drain.py)."""
    if run.state not in (State.PAUSED, State.CANCELLED):
        return ""
    drained = drain_after(run, run.state_changed_at)
    if drained is None:
        return ""
    return drained_text(drained, "pause" if drained.get("from") == "pausing" else "cancel")


def reports_context(run: Run) -> dict[str, Any]:
    interventions = recent_interventions(run, INTERVENTIONS_SHOWN)
    reports = run_reports(run, interventions)  # revalidation, compensation plans, recovery gate
    return {
        "interventions": [
            {
                "i": i,
                "r": receipt_dict(i),
                "rep": reports["reports"][i.pk],
                "receipt": present(receipt_rest(i, reports["reports"][i.pk])),
            }
            for i in interventions
        ],
        "plans": reports["plans"],
        "recovery": reports["recovery"],
    }


def timeline_context(run: Run, params: QueryDict | None = None) -> dict[str, Any]:
    params = params or QueryDict()
    kinds = tl.parse_kinds(params)
    page = tl.timeline(run, kinds=kinds, before=tl.parse_time(params.get("tl_before")))
    chosen = QueryDict(mutable=True)
    chosen.setlist("kind", kinds)
    return {
        "timeline": page,
        "timeline_kinds": list(tl.KINDS),
        "timeline_query": chosen.urlencode(),
        "timeline_older_page": bool(params.get("tl_before")),
    }


# Child runs drawn in the tree section; the rest are a link away (a tree may hold thousands).
TREE_SHOWN = 200


def other_context(run: Run) -> dict[str, Any]:
    grants = run_grants(run)
    checkpoints = recent_checkpoints(run, CHECKPOINTS_SHOWN)
    tree = _tree(run)
    return {
        "grants": [{"g": g, "status": g.effective_status()} for g in grants],
        "tree": tree[:TREE_SHOWN],
        "tree_total": len(tree),
        "cascades": running_cascades(run),
        "checkpoints": [{"c": c, "state": present(c.state)} for c in checkpoints],
        "checkpoints_total": run.checkpoint_seq,
    }


def audit_context(run: Run) -> dict[str, Any]:
    return {
        "audit": [
            {"a": a, "context": present(a.context)} for a in run_audit_events(run.pk, AUDIT_LIMIT)
        ],
    }


# Which builders each section needs (the header's context is always there: every section reads run).
NEEDS: dict[str, tuple[Callable[..., dict[str, Any]], ...]] = {
    "header": (),
    "ledger": (effects_page,),
    "compensation": (reports_context,),
    "recovery": (reports_context,),
    "interventions": (reports_context,),
    "timeline": (timeline_context,),
    "authority": (other_context,),
    "tree": (other_context,),
    "attempts": (),
    "checkpoints": (other_context,),
    "approvals": (),
    "audit": (audit_context,),
}
DETAIL_PARTS = (*NEEDS, "sections")
# The page and its resync: every section but the audit trail, which is a click away (and not live).
PAGE_PARTS = tuple(p for p in NEEDS if p != "audit")


def detail_context(
    run: Run,
    user,
    roles: frozenset[str],
    parts: Iterable[str] | None = None,
    params: QueryDict | None = None,
) -> dict[str, Any]:
    """The context of the chosen sections (all by default)."""
    params = params or QueryDict()
    ctx = header_context(run, user, roles)
    builders: list[Callable[..., dict[str, Any]]] = []
    for part in PAGE_PARTS if parts is None else parts:
        for builder in NEEDS.get(part, ()):
            if builder not in builders:
                builders.append(builder)
    for builder in builders:
        if builder is effects_page:
            ctx |= effects_page(run, params.get("effects_before"))
        elif builder is timeline_context:
            ctx |= timeline_context(run, params)
        else:
            ctx |= builder(run)
    return ctx


@console_view
@require_GET
def run_page(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    run = visible_run_or_404(request.actor, run_id)
    part = request.GET.get("part", "")
    if is_fragment(request) and part in DETAIL_PARTS:
        parts = None if part == "sections" else [part]
        ctx = detail_context(run, request.user, request.roles, parts, request.GET)
        if part == "ledger" and request.GET.get("effects_before"):
            return render(request, "console/run_detail.html#effect-rows", ctx)  # "older": more rows
        if part == "timeline" and request.GET.get("tl_before"):
            return render(request, "console/run_detail.html#timeline-entries", ctx)
        return render(request, f"console/run_detail.html#{part}", ctx)
    ctx = detail_context(run, request.user, request.roles, params=request.GET)
    # A notification's link: the approval it names is marked and scrolled to (static/console.js).
    ctx["linked_approval"] = request.GET.get("approval", "")[:40]
    return render(request, "console/run_detail.html", ctx)


# --- live pushes ------------------------------------------------------------------------------------

# The sections a fact changes, by fact kind (history kinds, and core.live's "lease", "job",
# "intervention", "run"). The header is redrawn for every fact of the page's own run.
REPORTS = ("interventions", "compensation", "recovery")
FACT_SECTIONS: dict[str, tuple[str, ...]] = {
    "checkpoint": ("checkpoints",),
    "attempt_started": ("authority", "attempts"),
    "lease": ("authority", "attempts"),
    "state_changed": ("tree",),
    "run_created": ("tree",),
    "child_created": ("tree",),  # announced on the parent (runs/services/lifecycle.py)
    "ownership_transferred": ("authority",),
    "authority_suspended": ("authority",),
    "intervention": (*REPORTS, "tree"),  # the tree shows a cascade's progress
    "job": REPORTS,
    "job_failed": REPORTS,
    "revalidation": REPORTS,
    "assumption_reobserved": REPORTS,
    "recovery_report": REPORTS,
    "compensation_planned": REPORTS,
    "compensation_started": REPORTS,
    "compensation_step_done": (*REPORTS, "ledger-rows"),
    "compensation_finished": (*REPORTS, "ledger-rows"),
}
# The periodic refresh: a fact of each kind, so every live section is redrawn (known rows included).
REFRESH_FACTS = (
    "checkpoint",
    "lease",
    "job",
    "state_changed",
    "approval_decided",
    "intervention",
    "compensation_step_done",
)
EFFECT_FACTS = (
    "effect_intent",
    "effect_outcome",
    "effect_denied",
    "effect_discrepancy",
    "effect_reconciled",  # by an operator, or by a recovery's reconciler: the row settles live
)


def sections_for(kinds: Iterable[str]) -> set[str]:
    out = {"header"}
    for kind in kinds:
        if kind.startswith("approval_"):
            out.add("approvals")
        elif kind.startswith("authority_"):
            out.add("authority")
        out.update(FACT_SECTIONS.get(kind, ()))
    return out


class RunPagePush:
    """What one open run page has been sent, so the next push sends only what changed: the effect
    rows on screen (a new effect is prepended, a known one replaced) and the timeline's newest entry
    (new entries are prepended). ``resync`` sends everything and starts over."""

    OVERLAP_S = 2.0  # timeline entries are re-read this far back (commit order vs. clock order)

    def __init__(self, user, run_id: str, query: str = "") -> None:
        self.user, self.run_id = user, run_id
        self.params = QueryDict(query)
        self.known_effects: set[str] = set()
        # Rows sent as in flight: re-read on every push, so whatever settles them (a recovery, a
        # cancel) never leaves the page counting "in flight 62 s" on a finished run.
        self.in_flight: set[str] = set()
        self.oldest_effect: str | None = None  # the cursor of the oldest row on screen
        self.sent_entries: set[str] = set()
        self.newest_entry: datetime | None = None

    def _run(self) -> Run | None:
        actor = actor_for_user(self.user, None, component="console")
        return visible_run(actor, self.run_id)

    def resync(self) -> str:
        run = self._run()
        if run is None:
            return ""
        ctx = detail_context(run, self.user, roles_of(self.user), params=self._first_pages())
        self._remember(ctx)
        return render_to_string("console/run_detail.html#sections", ctx | {"oob": True})

    def _first_pages(self) -> QueryDict:
        q = self.params.copy()
        for key in ("effects_before", "tl_before"):
            q.pop(key, None)
        return q

    def _remember(self, ctx: dict[str, Any]) -> None:
        effects = ctx.get("effects") or []
        self.known_effects = {e["id"] for e in effects}
        self.in_flight = {e["id"] for e in effects if e.get("in_flight_s") is not None}
        self.oldest_effect = (
            f"{effects[-1]['declared_at']}_{effects[-1]['id']}" if effects else None
        )
        entries = ctx["timeline"]["entries"] if "timeline" in ctx else []
        self.sent_entries = {e.ref for e in entries}
        self.newest_entry = entries[0].at if entries else None

    def facts(self, own: dict[str, Any], tree_changed: bool) -> list[str]:
        """Fragments for the facts of this run (``own``: kind -> object ids) and, when a child run
        changed, the tree section: a list of WebSocket frames (table rows travel in frames of their
        own: an HTML parser drops a ``<tr>`` that follows a ``<section>``)."""
        run = self._run()
        if run is None:
            return []
        roles = roles_of(self.user)
        sections = sections_for(own) if own else set()
        if tree_changed:
            sections.add("tree")
        rows = "ledger-rows" in sections
        sections.discard("ledger-rows")
        ctx = detail_context(run, self.user, roles, parts=sections, params=self._first_pages())
        ctx["oob"] = True
        html: list[str] = [
            render_to_string(f"console/run_detail.html#{s}", ctx) for s in sorted(sections)
        ]
        effect_ids = {oid for kind in EFFECT_FACTS for oid in own.get(kind, ()) if oid}
        if rows:
            effect_ids |= self.known_effects  # a compensation step changes the rows' status
        if own:
            effect_ids |= self.in_flight
        new, changed = self._effect_rows(run, effect_ids) if effect_ids else ([], [])
        if new or changed:
            html.append(render_to_string("console/run_detail.html#effects-count", ctx))
        if own:
            html.append(self._new_entries(run, own, ctx))
        frames = ["".join(html)]
        if new:
            frames.append(
                render_to_string("console/run_detail.html#effects-new", ctx | {"new_effects": new})
            )
        if changed:
            frames.append(
                render_to_string(
                    "console/run_detail.html#effects-changed", ctx | {"changed_effects": changed}
                )
            )
        return [f.strip() for f in frames if f.strip()]

    def _effect_rows(
        self, run: Run, ids: set[str]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(new rows, newest first; changed rows). A row is new unless the page shows it or it is
        older than the oldest row on the page (then it is on an "older" page, or not shown)."""
        now = timezone.now()
        effects = effects_by_ids(run, list(ids)[:EFFECTS_PAGE])
        effects.sort(key=effects_cursor)
        new, changed = [], []
        for e in effects:
            row = effect_row(e, now)
            if row.get("in_flight_s") is None:
                self.in_flight.discard(row["id"])
            else:
                self.in_flight.add(row["id"])
            known = row["id"] in self.known_effects
            older = self.oldest_effect is not None and effects_cursor(e) < self.oldest_effect
            if known or older:
                changed.append(row)
                continue
            new.append(row)
            self.known_effects.add(row["id"])
            if self.oldest_effect is None:
                self.oldest_effect = effects_cursor(e)
        new.reverse()  # afterbegin inserts the block as is: newest first, like the page
        return new, changed

    def _new_entries(self, run: Run, own: dict[str, Any], ctx: dict[str, Any]) -> str:
        after = None
        if self.newest_entry is not None:
            after = self.newest_entry - timedelta(seconds=self.OVERLAP_S)
        # History holds every fact but three: interventions, lease ends and jobs have tables of their
        # own (refusals are not announced: a denied decision changed nothing).
        sources = {"history"} | (set(own) & {"intervention", "lease", "job"})
        page = tl.timeline(run, kinds=tl.parse_kinds(self.params), after=after, sources=sources)
        fresh = [e for e in page["entries"] if e.ref not in self.sent_entries]
        # An intervention's line carries its status (pending -> completed): sent again when it
        # changes; the page replaces the line it shows (static/console/console.js).
        again = {f"i-{oid}" for oid in own.get("intervention", ()) if oid}
        if again and "intervention" in (tl.parse_kinds(self.params) or tl.KINDS):
            have = {e.ref for e in fresh}
            fresh += [
                e for e in tl.interventions_by_ref(run, again - have) if e.ref in self.sent_entries
            ]
        if not fresh:
            return ""
        self.sent_entries.update(e.ref for e in fresh)
        newest = max(e.at for e in fresh)
        if self.newest_entry is None or newest > self.newest_entry:
            self.newest_entry = newest
        fresh.sort(key=lambda e: e.at, reverse=True)
        return render_to_string(
            "console/run_detail.html#timeline-push",
            ctx | {"timeline": {"entries": fresh}, "oob": False},
        )


def render_detail_push(user, run_id: Any) -> str:
    """Every section of the run page as out-of-band swaps, fresh from the database."""
    return RunPagePush(user, str(run_id)).resync()
