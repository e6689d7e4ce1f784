"""Console pages at scale (issue 10, "Budgets"): the run list among 100,000 runs and the page of a run
with 1,000 effects and 5,000 history events, on PostgreSQL. A benchmark, not a test.

    .venv/bin/python -m bench.console [--runs 100000] [--repeat 15] [--fresh-db] [--quick]
                                      [--no-live] [--sizes JSON] [--out bench/results/console.json]

It seeds a scratch database (``DATABASE_URL``, default ``…/controlplane_console_bench``; created and
migrated if missing, seeded once, reused after) with COPY, then renders pages in-process with
Django's test client as a logged-in viewer, ``DEBUG`` off: server time per page (request in,
response out: middleware, views, queries, templates; no network), its p50/p95 over ``--repeat``
requests, and the number of SQL queries each page ran. List pages include deep keyset pages (the
cursor of the 50,000th run), every sort and each filter. EXPLAIN ANALYZE of the list's main query
on a deep page is kept in the JSON. Targets: list p95 ≤ 150 ms with the same number of queries on
every page; run page p95 ≤ 300 ms. Then bench/console_live.py: fact-to-screen p95 ≤ 1 s with 10
open run pages while protocol workers run, and the protocol's effects/s with 10 open list pages at
most 10 % below 0 (real daphne servers, WebSockets, worker processes). ``BENCH_QUICK=1``: smaller.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import harness

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/controlplane_console_bench"
LIST_TARGET_MS = 150.0
RUN_PAGE_TARGET_MS = 300.0
AGENTS = ["purchasing", "refunds", "address-verifier", "lg-purchasing", "oa-purchasing"]
STATES = ["succeeded"] * 60 + ["failed"] * 8 + ["running"] * 10 + ["queued"] * 6 + ["paused"] * 5
STATES += ["cancelled"] * 4 + ["compensated"] * 2 + ["closed"] * 3 + ["orphaned", "needs_attention"]
TOOLS = [("payments", "charge"), ("inventory", "reserve"), ("shipping", "book"), ("notify", "send")]
BIG_EFFECTS, BIG_HISTORY = 1000, 5000
SEED_TEAM, SEED_TEAM_AGENT = "support", "address-verifier"  # a second team: 1 run in 5
FACT_TO_SCREEN_TARGET_MS = 1000.0
THROUGHPUT_DROP_TARGET_PCT = 10.0
GOALS: list[dict[str, Any]] = [
    {"key": "list_p95_ms", "goal": "list page p95 (server time, worst page)", "op": "<=",
     "target": LIST_TARGET_MS, "unit": "ms"},
    {"key": "list_query_counts", "goal": "distinct query counts across list pages", "op": "<=",
     "target": 1, "unit": ""},
    {"key": "run_page_p95_ms", "goal": "run page p95 (1,000 effects, 5,000 events)", "op": "<=",
     "target": RUN_PAGE_TARGET_MS, "unit": "ms"},
    {"key": "fact_to_screen_p95_ms", "goal": "fact-to-screen p95, 10 open pages, protocol running",
     "op": "<=", "target": FACT_TO_SCREEN_TARGET_MS, "unit": "ms"},
    {"key": "effects_per_s_drop_pct", "goal": "protocol effects/s drop with 10 open list pages",
     "op": "<=", "target": THROUGHPUT_DROP_TARGET_PCT, "unit": "%"},
    # issue 18: an open dialog adds nothing per pushed fact. Half a statement is the noise of other
    # server work landing in one phase and not the other; a real cost (a read per push) is one or more.
    {"key": "dialog_statements_per_fact_added", "goal": "SQL per pushed fact added by an open dialog",
     "op": "<=", "target": 0.5, "unit": ""},
    {"key": "dialog_page_requests", "goal": "requests the page makes while its dialog is open",
     "op": "<=", "target": 0, "unit": ""},
]  # fmt: skip


def live_sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"servers": 2, "workers": 4, "pages": 10, "effects_per_run": 20,
                "probe_effects": 3, "probe_load_s": 15.0, "phase_s": 8.0, "throughput_rounds": 2,
                "dialog_phases": 6, "dialog_facts": 24}  # fmt: skip
    return {"servers": 2, "workers": 8, "pages": 10, "effects_per_run": 20,
            "probe_effects": 8, "probe_load_s": 40.0, "phase_s": 20.0, "throughput_rounds": 2,
            "dialog_phases": 8, "dialog_facts": 40}  # fmt: skip


def goals_table(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal beside its measured value; ``met`` is None when it was not measured (as in
    bench/results/summary.json)."""
    rows = []
    for g in GOALS:
        value = measured.get(g["key"])
        met = None if value is None else value <= g["target"]
        rows.append({**g, "measured": value, "met": met})
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    # BENCH_CONSOLE_RUNS=1000000: issue 24's size (a database of its own: one seeded with fewer runs
    # is topped up by nothing, it is seeded only when empty enough).
    runs = int(os.environ.get("BENCH_CONSOLE_RUNS") or (20_000 if quick else 100_000))
    p.add_argument("--runs", type=int, default=runs)
    p.add_argument("--seed-only", action="store_true", help="seed the database, measure nothing")
    p.add_argument(
        "--repeat", type=int, default=6 if quick else 15, help="requests per page measured"
    )
    p.add_argument("--quick", action="store_true", default=quick, help="BENCH_QUICK=1: smaller")
    p.add_argument("--no-live", action="store_true", help="skip the daphne/WebSocket measurements")
    p.add_argument("--sizes", default="", help="JSON overriding live sizes (tests run tiny ones)")
    p.add_argument("--fresh-db", action="store_true", help="drop and recreate the database first")
    name = "console_1m.json" if runs >= 1_000_000 else "console.json"
    p.add_argument("--out", default=str(harness.RESULTS_DIR / name))
    return p.parse_args(argv)


# --- seeding (COPY) -------------------------------------------------------------------------------


def _copy(cursor, model, rows: Iterable[dict[str, Any]]) -> None:
    """COPY rows of ``model``: every concrete column, the given value or the field's default."""
    from django.db.models import JSONField
    from psycopg.types.json import Jsonb

    cols = [f for f in model._meta.concrete_fields if not f.db_returning]  # serial ids: the db's
    names = ", ".join(f'"{f.column}"' for f in cols)
    defaults = {f.attname: f.get_default() for f in cols}
    with cursor.copy(f'COPY "{model._meta.db_table}" ({names}) FROM STDIN') as copy:
        for row in rows:
            values = []
            for f in cols:
                value = row.get(f.attname, defaults[f.attname])
                if isinstance(f, JSONField) and value is not None:
                    value = Jsonb(value)
                values.append(value)
            copy.write_row(values)


def seed(n_runs: int) -> dict[str, Any]:
    """COPY ``n_runs`` runs (plus the big run) into an empty database, streamed: rows are made as
    COPY reads them, so 1,000,000 runs need no more memory than 1,000. Runs of the agent
    ``address-verifier`` belong to the team ``support`` (the team filter and switcher have two
    teams to tell apart); one run in 1,000 went through a recovery (a done ``recovery`` job: the
    "recovered" filter)."""
    import random

    from django.contrib.auth.models import Group, User
    from django.db import connection, transaction

    from interventions.models_jobs import Job
    from runs.models import Agent, Effect, HistoryEvent, Run, Team

    rng = random.Random(10)
    present = Run.objects.count()
    if 0 < present < n_runs:  # seeding again would add a second set (and a second big run)
        raise SystemExit(
            f"the database holds {present} runs, fewer than {n_runs}: give another database "
            "(BENCH_CONSOLE_DATABASE_URL) or --fresh-db"
        )
    if present >= n_runs and not Team.objects.filter(slug=SEED_TEAM).exists():
        raise SystemExit(  # an older bench's seed: no team or recovered runs to measure filters on
            "the database was seeded by an older bench.console (no team "
            f"{SEED_TEAM!r}): give another database (BENCH_CONSOLE_DATABASE_URL) or --fresh-db"
        )
    if present >= n_runs:
        big = Run.objects.filter(goal="big run").first()
        return {
            "seeded": False,
            "runs": Run.objects.count(),
            "big_run": str(big.pk) if big else None,
        }
    started = time.perf_counter()
    support = Team.objects.get_or_create(slug=SEED_TEAM, defaults={"name": "Support"})[0]
    agents = [Agent.objects.get_or_create(name=a)[0] for a in AGENTS]
    team_of = {a.pk: (support.pk if a.name == SEED_TEAM_AGENT else None) for a in agents}
    Agent.objects.filter(name=SEED_TEAM_AGENT).update(team=support)
    owners = []
    for name in ("otto", "olga", "ian"):
        user, _ = User.objects.get_or_create(username=name)
        user.groups.add(Group.objects.get_or_create(name="operator")[0])
        owners.append(user)
    now = datetime.now(UTC)
    n = {"effects": 0, "recovered": 0}
    run_effects: list[tuple[Any, ...]] = []  # made with their run (compact), written after the runs
    recovered: list[Any] = []

    def runs():
        for i in range(n_runs):
            created = now - timedelta(seconds=i * 30 + rng.random())  # ~35 days per 100,000
            run_id = uuid.uuid4()
            owner = rng.choice(owners) if rng.random() < 0.2 else None
            agent = rng.choice(agents).pk
            yield {
                "id": run_id,
                "agent_id": agent,
                "team_id": team_of[agent],
                "goal": f"buy {rng.randint(1, 9)} of sku-{rng.randint(1, 5000)}",
                "state": rng.choice(STATES),
                "created_at": created,
                "updated_at": created + timedelta(seconds=rng.randint(1, 600)),
                "state_changed_at": created + timedelta(seconds=rng.randint(1, 600)),
                "assignee_id": owner.pk if owner else None,
                "attempt_count": 1,
            }
            if rng.random() < 0.001:
                recovered.append((run_id, created))
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                tool, action = rng.choice(TOOLS)
                status = "unknown" if rng.random() < 0.0005 else "committed"
                run_effects.append((run_id, tool, action, status, created))

    def effects():
        # The runs are COPYed first (the effects' foreign key); their effects were made with them.
        yield from (_effect(*row) for row in run_effects)
        for i in range(BIG_EFFECTS):
            tool, action = TOOLS[i % len(TOOLS)]
            status = "in_flight" if i >= BIG_EFFECTS - 3 else "committed"
            yield _effect(big_id, tool, action, status, now + timedelta(milliseconds=i))

    big_id = uuid.uuid4()
    big_row = {
        "id": big_id,
        "agent_id": agents[0].pk,
        "goal": "big run",
        "state": "running",
        "created_at": now,
        "updated_at": now,
        "state_changed_at": now,
        "attempt_count": 1,
        "history_seq": BIG_HISTORY,
    }  # fmt: skip
    history = (
        {
            "run_id": big_id,
            "seq": s,
            "kind": "effect.declared" if s % 2 else "checkpoint",
            "actor": "worker-1",
            "data": {"step": f"step-{s}", "n": s},
            "created_at": now + timedelta(milliseconds=s),
            "prev_hash": f"{s - 1:064x}",
            "hash": f"{s:064x}",
        }  # fmt: skip
        for s in range(1, BIG_HISTORY + 1)
    )
    jobs = (
        {
            "id": uuid.uuid4(),
            "kind": "recovery",
            "target_id": str(run_id),
            "run_id": run_id,
            "status": "done",
            "attempts": 1,
            "timeout_s": 60,
            "created_at": at,
            "finished_at": at + timedelta(seconds=5),
            "due_at": at + timedelta(seconds=60),
        }
        for run_id, at in recovered
    )
    with transaction.atomic(), connection.cursor() as cursor:
        _copy(cursor, Run, itertools.chain(runs(), [big_row]))
        n["effects"] = len(run_effects) + BIG_EFFECTS
        _copy(cursor, Effect, effects())
        run_effects.clear()
        _copy(cursor, HistoryEvent, history)
        n["recovered"] = len(recovered)
        _copy(cursor, Job, jobs)
    with connection.cursor() as cursor:
        # What autovacuum does soon after a bulk load: statistics, and the visibility map that lets
        # a count read an index alone.
        cursor.execute("VACUUM ANALYZE")
    return {
        "seeded": True,
        "runs": n_runs + 1,
        "effects": n["effects"],
        "history_events": BIG_HISTORY,
        "recovered_runs": n["recovered"],
        "seed_s": round(time.perf_counter() - started, 1),
        "big_run": str(big_id),
    }


def _effect(run_id, tool: str, action: str, status: str, at: datetime) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "run_id": run_id,
        "step": action,
        "tool": tool,
        "action": action,
        "idempotency_key": uuid.uuid4().hex,
        "fingerprint": "0" * 64,
        "args": {"amount": 100},
        "decision": "authorized",
        "status": status,
        "declared_at": at,
        "outcome_at": at if status == "committed" else None,
    }


# --- measuring ------------------------------------------------------------------------------------


def measure(client, path: str, repeat: int, **headers: str) -> dict[str, Any]:
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    resp = client.get(path, **headers)  # warm (template compile, plan cache)
    if resp.status_code != 200:
        raise SystemExit(f"GET {path} answered {resp.status_code}: {resp.content[:300]!r}")
    times, cpu = [], []
    reset_queries()  # the request_started signal empties the log: start the capture from empty
    with CaptureQueriesContext(connection) as ctx:
        client.get(path, **headers)
    captured = ctx.captured_queries  # read now: the next request empties the log it points into
    db_ms = sum(float(q["time"]) for q in captured) * 1000
    slowest = sorted(captured, key=lambda q: -float(q["time"]))[:2]
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        resp = client.get(path, **headers)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return {
        "path": path if len(path) < 160 else path[:157] + "...",
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(sorted(times)[max(0, int(len(times) * 0.95) - 1)], 1),
        "max_ms": round(max(times), 1),
        # CPU of this (the web) process per request: what the page costs here, whatever else the
        # machine runs; the database's share is in db_ms (wall time of its queries, one request).
        "cpu_p50_ms": round(statistics.median(cpu), 1),
        "cpu_p95_ms": round(sorted(cpu)[max(0, int(len(cpu) * 0.95) - 1)], 1),
        "db_ms": round(db_ms, 1),
        "queries": len(captured),
        "slowest_queries": [
            {"ms": round(float(q["time"]) * 1000, 1), "sql": q["sql"][:160]} for q in slowest
        ],
        "html_kb": round(len(resp.content) / 1024, 1),
    }


def cursor_at(offset: int, sort: str, query: str = "", user=None) -> str:
    """The keyset cursor of the run at ``offset`` in ``sort``'s order among the runs ``query``
    selects for ``user`` (the viewer by default): what "next" links carry."""
    from django.http import QueryDict

    from core.auth import actor_for_user
    from core.filters import encode_cursor
    from runs.search import RunFilter, _key_of

    flt = RunFilter.from_query(QueryDict(f"sort={sort}&{query}"))
    order = [f"-{k}" if flt.descending else k for k in flt.sort_key]
    runs = flt.queryset(actor_for_user(user or _viewer())).order_by(*order)
    n = runs.count()
    # a negative offset counts from the end; past the end: the page of the last 20
    run = runs[max(0, min(offset if offset >= 0 else n + offset, n - 20))]
    return encode_cursor(_key_of(run, flt.sort_key))


def deep(query: str, fraction: float = 0.5, sort: str = "-created", user=None) -> str:
    """``query``'s list page that starts ``fraction`` of the way down its runs."""
    from django.http import QueryDict

    from core.auth import actor_for_user
    from runs.search import RunFilter

    flt = RunFilter.from_query(QueryDict(query))
    n = flt.queryset(actor_for_user(user or _viewer())).count()
    cursor = cursor_at(int(n * fraction), sort, query, user)
    return f"/?{query}&after={cursor}" if query else f"/?after={cursor}"


def explain(path: str) -> list[str]:
    """EXPLAIN ANALYZE of the list page's main query (the one selecting the page's runs)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(_viewer())
    with CaptureQueriesContext(connection) as ctx:
        client.get(path)
    main = next(q["sql"] for q in ctx.captured_queries if "LIMIT 51" in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + main)
        return [row[0] for row in cursor.fetchall()]


def explain_slowest(
    results: dict[str, Any], paths: dict[str, str], lead, pages: int = 3, queries: int = 2
) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the slowest queries of the ``pages`` slowest list pages (by p95)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    out: dict[str, Any] = {}
    slow = sorted((k for k in paths if k in results), key=lambda k: -results[k]["p95_ms"])
    for name in slow[:pages]:
        client = Client()
        client.force_login(lead if name.startswith("two teams") else _viewer())
        with CaptureQueriesContext(connection) as ctx:
            client.get(paths[name])
        plans = []
        for q in sorted(ctx.captured_queries, key=lambda q: -float(q["time"]))[:queries]:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
                plan = [row[0] for row in cursor.fetchall()]
            plans.append(
                {"ms": round(float(q["time"]) * 1000, 1), "sql": q["sql"][:300], "plan": plan}
            )
        out[name] = {"p95_ms": results[name]["p95_ms"], "queries": plans}
    return out


def _viewer():
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username="bench-viewer")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    return user


def _two_team_viewer():
    """A viewer in the default team and ``support``: the team switcher (a count per team) shows."""
    from django.contrib.auth.models import Group, User

    from runs.models import Team, TeamMembership

    user, _ = User.objects.get_or_create(username="bench-lead")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    for slug in ("default", SEED_TEAM):
        team = Team.objects.get_or_create(slug=slug)[0]
        TeamMembership.objects.get_or_create(team=team, user=user)
    return user


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from django.test import Client

    from runs.models import Run

    facts = seed(args.runs)
    n_runs = facts["runs"]
    client = Client()
    client.force_login(_viewer())
    some = str(Run.objects.order_by("created_at").values_list("pk", flat=True)[n_runs // 20])
    middle = cursor_at(n_runs // 2, "-created")  # the 50,000th run of 100,000
    lists = {
        "first page": "/",
        "page 2": "/?after=" + cursor_at(49, "-created"),
        "deep page (middle run)": "/?after=" + middle,
        "last page": "/?after=" + cursor_at(-20, "-created"),
        "back from a deep page": "/?before=" + middle,
        "sort updated, deep": "/?sort=-updated&after=" + cursor_at(n_runs // 2, "-updated"),
        "sort state, deep": "/?sort=state&after=" + cursor_at(n_runs // 2, "state"),
        "sort agent, deep": "/?sort=agent&after=" + cursor_at(n_runs // 2, "agent"),
        "state chips running+paused": "/?state=running&state=paused",
        "agent refunds": "/?agent=refunds",
        "owner otto": "/?owner=otto",
        "touched payments:charge": "/?touched=payments:charge",
        "needs attention": "/?attention=1",
        "created since 2h": "/?since=2h",
        "search id prefix": "/?q=" + some[:8],
        "search goal text": "/?q=sku-4242",
        # Each filter again at depth: its middle page, and its last (issue 24: "at every depth").
        "state failed, deep": deep("state=failed"),
        "state failed, last page": deep("state=failed", 1.0),
        "agent refunds, deep": deep("agent=refunds"),
        "owner otto, deep": deep("owner=otto"),
        "touched payments:charge, deep": deep("touched=payments:charge"),
        "needs attention, deep": deep("attention=1"),
        "needs attention, last page": deep("attention=1", 1.0),
        "created since 2h, sort updated": "/?since=2h&sort=-updated",
        "search agent name": "/?q=refunds",
        "search agent name, deep": deep("q=refunds"),
        "recovered": "/?recovered=1",
        "recovered, deep": deep("recovered=1"),
        "state running, agent refunds, owner otto": "/?state=running&agent=refunds&owner=otto",
    }
    lead = _two_team_viewer()
    team_lists = {  # a viewer in two teams: the team switcher, and the team filter
        "two teams: first page": "/",
        "two teams: team support": f"/?team={SEED_TEAM}",
        "two teams: team support, deep": deep(f"team={SEED_TEAM}", user=lead),
        "two teams: team default, deep": deep("team=default", user=lead),
        "two teams: deep page": deep("", user=lead),
    }
    results: dict[str, Any] = {}
    for name, path in lists.items():
        results[name] = measure(client, path, args.repeat)
    lead_client = Client()
    lead_client.force_login(lead)
    for name, path in team_lists.items():
        results[name] = measure(lead_client, path, args.repeat)
    results["htmx swap (fragment), failed"] = measure(
        client, "/?state=failed", args.repeat, HTTP_HX_REQUEST="true"
    )
    api = {"api first page": "/api/v1/runs", "api attention": "/api/v1/runs?attention=1"}
    for name, path in api.items():
        results[name] = measure(client, path, args.repeat)
    big = facts["big_run"]
    big_page = measure(client, f"/runs/{big}/", max(5, args.repeat // 3))
    run_results: dict[str, Any] = {"run page (1,000 effects, 5,000 events)": big_page}
    t0 = time.perf_counter()
    resp = client.get(f"/runs/{big[:8]}/")
    run_results["run by 8-char prefix (redirect)"] = {
        "status": resp.status_code,
        "ms": round((time.perf_counter() - t0) * 1000, 1),
    }
    plain = [r for k, r in results.items() if not k.startswith("api")]
    query_counts = sorted({r["queries"] for k, r in results.items() if k in list(lists)[:8]})
    return {
        "facts": facts,
        "list_pages": results,
        "run_page": run_results,
        "summary": {
            "list_p95_ms_worst": max(r["p95_ms"] for r in plain),
            "list_target_ms": LIST_TARGET_MS,
            "list_within_target": all(r["p95_ms"] <= LIST_TARGET_MS for r in plain),
            "queries_per_list_page_unfiltered_pages": query_counts,
            "constant_queries_across_pages": len(query_counts) == 1,
            "run_page_p95_ms": run_results["run page (1,000 effects, 5,000 events)"]["p95_ms"],
            "run_page_target_ms": RUN_PAGE_TARGET_MS,
        },
        "explain_deep_page": explain("/?after=" + middle),
        "explain_attention": explain("/?attention=1"),
        # the slowest pages' every query, with its plan (issue 24: EXPLAIN ANALYZE the slow ones)
        "explain_slowest": explain_slowest(results, {**lists, **team_lists}, lead),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    if not database_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("bench.console needs a PostgreSQL DATABASE_URL")
    created = harness.ensure_database(database_url, fresh=args.fresh_db)
    env = harness.bench_env(database_url, os.environ.get("REDIS_URL") or harness.DEFAULT_REDIS_URL)
    harness.manage(env, "migrate", "--noinput", "-v", "0")
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "DEBUG", "DJANGO_SETTINGS_MODULE")})
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    if args.seed_only:
        print(json.dumps(seed(args.runs)))
        return 0
    result: dict[str, Any] = {
        "benchmark": "console",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": harness.redact(database_url),
        "database_created": created,
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_avg_1_5_15": [round(x, 1) for x in os.getloadavg()],
        },
    } | run_bench(args)
    if not args.no_live:
        from bench import console_live

        size = live_sizes(args.quick) | (json.loads(args.sizes) if args.sizes else {})
        result["live_sizes"] = size
        result |= console_live.measure_live(database_url, size)
    result["machine"]["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    s = result["summary"]
    result["measured"] = {
        "list_p95_ms": s["list_p95_ms_worst"],
        "list_query_counts": len(s["queries_per_list_page_unfiltered_pages"]),
        "run_page_p95_ms": s["run_page_p95_ms"],
        "run_page_queries": result["run_page"]["run page (1,000 effects, 5,000 events)"]["queries"],
        "fact_to_screen_p50_ms": result.get("fact_to_screen", {}).get("fact_to_screen_p50_ms"),
        "fact_to_screen_p95_ms": result.get("fact_to_screen", {}).get("fact_to_screen_p95_ms"),
        "effects_per_s_drop_pct": result.get("throughput", {}).get("drop_pct"),
        "dialog_statements_per_fact_added": result.get("dialog_cost", {}).get(
            "statements_per_fact_added_by_dialog"
        ),
        "dialog_page_requests": result.get("dialog_cost", {}).get("page_requests_while_open"),
    }
    goals = goals_table(result["measured"])
    if result["facts"]["runs"] >= 1_000_000:  # issue 24 item 4: the same budgets at 1,000,000 runs
        result["goals_24"] = [
            {**g, "key": f"console_{g['key']}_1m", "goal": f"{g['goal']} at 1,000,000 runs"}
            for g in goals
            if g["key"] in ("list_p95_ms", "run_page_p95_ms")
        ]
    result = {"goals": goals} | result
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result, out)
    return 0


def print_summary(result: dict[str, Any], out: Path) -> None:
    buf = io.StringIO()
    buf.write(f"console bench: {result['facts'].get('runs')} runs; results in {out}\n")
    for name, r in result["list_pages"].items():
        times = f"p50 {r['p50_ms']:7.1f}  p95 {r['p95_ms']:7.1f} ms  cpu p95 {r['cpu_p95_ms']:6.1f}"
        buf.write(
            f"  {name:30} {times}  db {r['db_ms']:5.1f}  {r['queries']:2} q  {r['html_kb']} KB\n"
        )
    for name, r in result["run_page"].items():
        buf.write(f"  {name:32} {r}\n")
    buf.write(
        f"  summary: {result['summary']}\n  load average: {result['machine']['load_avg_1_5_15']}\n"
    )
    if "fact_to_screen" in result:
        buf.write(f"  fact to screen: {result['fact_to_screen']}\n")
        buf.write(f"  throughput: {result['throughput']}\n")
    if "dialog_cost" in result:
        buf.write(
            f"  dialog cost: { {k: v for k, v in result['dialog_cost'].items() if k != 'phases'} }\n"
        )
    for g in result["goals"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[g["met"]]
        buf.write(
            f"  {g['goal']:55} {g['op']} {g['target']:7} {g['unit']:3} {g['measured']!s:>8}  {verdict}\n"
        )
    print(buf.getvalue(), end="")


if __name__ == "__main__":
    raise SystemExit(main())
