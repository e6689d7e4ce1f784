"""The operator console: the run list and the id-prefix page (server-rendered, htmx, live over Channels).

One template serves the full page, its htmx swap and its WebSocket push (Django 6 template
partials). Views read through the selectors and never write; console/interventions.py calls the
services. Pushes are hints, rendered from the database: the live list's shared row-level updates are
console/list_live.py's, the run page's fragments console/run_page.py's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import BadRequest
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.common import (
    ConsoleRequest,
    console_view,
    is_fragment,
)
from core.filters import BadFilter, check_text
from interventions.triage import attention_reasons
from runs.freezes import covering, freeze_dict, live_standing
from runs.models import DEFAULT_TEAM, Run, StandingFreeze
from runs.search import (
    RunFilter,
    attention_count,
    page_runs,
    runs_by_prefix,
    state_counts,
)
from runs.selectors import active_usernames, agent_names, run_summary
from runs.states import State
from runs.team_scope import slugs as team_slugs
from runs.team_scope import teams_for

# --- run list -------------------------------------------------------------------------------------
# What the list shows is runs/search.py's RunFilter (the same filter the API and fleet operations
# read), paged by keyset: the URL holds the filter, the sort and the cursor, so a view can be shared.

PAGE_SIZE = 50
# The "needs attention" chip counts up to this many ("100+"). Counting stops at the cap+1st match,
# so its cost is the cap over the share of runs in trouble: at 1,000,000 runs (2 % in trouble) a
# cap of 1,000 read 50,000 runs per render (30-120 ms), 100 reads a tenth of that.
ATTENTION_CAP = 100
SORT_LABELS = {"created": "created", "updated": "updated", "state": "state", "agent": "agent"}


def run_row(
    run: Run, now: datetime | None = None, freezes: list[StandingFreeze] | None = None
) -> dict[str, Any]:
    """What one row of the list shows (the ``run-row`` partial draws it): times relative, with the
    absolute time for the hover, computed here once (a template filter per cell costs more).
    ``freezes``: the standing freezes covering the run (runs.freezes.covering, read once a page)."""
    now = now or timezone.now()
    unresolved = getattr(run, "n_unresolved", None)
    return run_summary(run, unresolved) | {
        "frozen": [
            {"capability": f.capability, "title": f"{f.scope_label} · {f.frozen_by}: {f.reason}"}
            for f in freezes or ()
        ],
        "url": reverse("console:run", args=[run.pk]),
        "created": _when(run.created_at, now),
        "updated": _when(run.updated_at, now),
        "state_since": _when(run.state_changed_at, now),
    }


def run_rows(runs: list[Run], flt: RunFilter, now: datetime | None = None) -> list[dict[str, Any]]:
    """The rows of a page of runs; in the "needs attention" view each carries why, in words
    (interventions/triage.py: a query per kind of trouble for the whole page)."""
    now = now or timezone.now()
    frozen = covering(runs)  # the standing freezes over each run, read once for the page
    # team id -> slug: one query for the page, none where every run is the default team's
    names = team_slugs() if any(r.team_id for r in runs) else {0: DEFAULT_TEAM}
    rows = [run_row(r, now, frozen[r.pk]) | {"team": names.get(r.team_id or 0)} for r in runs]
    if flt.attention:
        reasons = attention_reasons(runs, now)
        for row in rows:
            row["reasons"] = reasons.get(row["id"], [])
    return rows


def _when(moment: datetime, now: datetime) -> dict[str, str]:
    seconds = int((now - moment).total_seconds())
    if seconds < 0:
        ago = "just now"
    elif seconds < 60:
        ago = f"{seconds} s ago"
    elif seconds < 3600:
        ago = f"{seconds // 60} min ago"
    elif seconds < 86400:
        ago = f"{seconds // 3600} h {seconds % 3600 // 60} min ago"
    else:
        ago = f"{seconds // 86400} d {seconds % 86400 // 3600} h ago"
    return {"ago": ago, "iso": moment.isoformat(), "abs": f"{moment:%Y-%m-%d %H:%M:%S} UTC"}


def list_context(
    actor, flt: RunFilter, *, after: str = "", before: str = "", limit: int = PAGE_SIZE
) -> dict[str, Any]:
    """One page of the list plus its chips: a constant number of queries whatever the page (the
    page, one GROUP BY for the state counts, one capped count for "needs attention")."""
    page = page_runs(actor, flt, after=after, before=before, limit=limit)
    base = flt.to_query()
    cursor = {"after": after} if after else {"before": before} if before else {}
    now = timezone.now()
    return counts_context(actor, flt) | {
        "runs": run_rows(list(page.runs), flt, now),
        "standing_freezes": [freeze_dict(f) for f in live_standing(actor=actor)],
        # each row's place in the order (a live page places joining runs by it: list_live.py)
        "row_keys": [tuple(getattr(r, name) for name in flt.sort_key) for r in page.runs],
        "query": flt.to_query(**cursor),
        "base_query": base,
        "next_query": flt.to_query(after=page.next_cursor) if page.next_cursor else None,
        "prev_query": flt.to_query(before=page.prev_cursor) if page.prev_cursor else None,
        "first_page": not (after or before),
        "sorts": [
            {
                "name": name,
                "label": label,
                "on": flt.sort.lstrip("-") == name,
                "desc": flt.descending,
                # click: descending first; on the active column, flip
                "query": flt.replace(
                    sort=name if flt.sort == f"-{name}" else f"-{name}"
                ).to_query(),
            }
            for name, label in SORT_LABELS.items()
        ],
        "nav": "runs",
        "limit": limit,
    }


def counts_context(actor, flt: RunFilter) -> dict[str, Any]:
    """The chips and the total (the ``run-counts`` partial): one GROUP BY for the state counts, one
    capped count for "needs attention". A live list patches them in place (console/list_live.py)."""
    counted = state_counts(actor, flt)
    counts = counted.by_state
    total = sum(counts.get(s, 0) for s in flt.states) if flt.states else counted.total
    attention = attention_count(actor, flt, timezone.now(), ATTENTION_CAP)
    return {
        "total": total,
        "counts_complete": counted.complete,
        "filter": flt,
        "chips": [
            {"state": s.value, "n": counts.get(s.value, 0), "on": s.value in flt.states}
            for s in State
            if counts.get(s.value) or s.value in flt.states
        ],
        "attention_n": min(attention, ATTENTION_CAP),  # "100+" past the cap, not "101+"
        "attention_more": attention > ATTENTION_CAP,
        "attention_cap": ATTENTION_CAP,
    }


def _filter_or_400(params: QueryDict) -> tuple[RunFilter, str, str]:
    try:
        flt = RunFilter.from_query(params)
        after = check_text("after", params.get("after", ""), max_len=400)
        before = check_text("before", params.get("before", ""), max_len=400)
    except BadFilter as exc:
        raise BadRequest(exc.detail) from None
    return flt, after, before


def team_switcher(actor) -> dict[str, Any] | None:
    """The team switcher's choices with their run counts: for people in two teams or more, or with
    the cross_team right (docs/operator/teams.md); None for everyone else."""
    if not actor.cross_team and len(actor.teams or ()) < 2:
        return None  # asked before any query: most people are in one team
    rows = teams_for(actor, tallied=True)
    return {"teams": rows, "total": sum(r["runs"] for r in rows)}


@console_view
@require_GET
def run_list(request: ConsoleRequest) -> HttpResponse:
    flt, after, before = _filter_or_400(request.GET)
    try:
        ctx = list_context(request.actor, flt, after=after, before=before)
    except BadFilter as exc:  # a cursor that does not decode
        raise BadRequest(exc.detail) from None
    if is_fragment(request):
        return render(request, "console/run_list.html#run-live", ctx)
    ctx |= {
        "agents": agent_names(request.actor),
        "owners": active_usernames(request.actor),
        "team_switcher": team_switcher(request.actor),
        "states": [s.value for s in State],
    }
    return render(request, "console/run_list.html", ctx)


@console_view
@require_GET
def run_by_prefix(request: ConsoleRequest, prefix: str) -> HttpResponse:
    """``/runs/<prefix>/``: the 8-character ids shown everywhere work as URLs. One match redirects
    to the run (keeping the rest of the path's query), several are listed, none is a 404."""
    try:
        matches = runs_by_prefix(request.actor, prefix)
    except BadFilter as exc:
        raise BadRequest(exc.detail) from None
    if len(matches) == 1:
        url = reverse("console:run", args=[matches[0].pk])
        if request.GET:
            url += "?" + request.GET.urlencode()
        return redirect(url)
    if not matches:
        raise Http404(f"no run starts with {prefix}")
    return render(
        request,
        "console/run_prefix.html",
        {"prefix": prefix, "runs": [run_row(r) for r in matches], "nav": "runs"},
    )
