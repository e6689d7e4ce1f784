"""The run-control conformance kit: does *your* agent honour the seven controls?

    python -m controlplane_sdk.conformance my_agent:build --out reports/conformance

``my_agent:build`` is a function ``build(tools) -> run_fn``: it returns your agent's run function
(``run_fn(ctx)``, written with the SDK or one of the adapters) with every external call made
through ``tools.call(tool, action, args, idempotency_key=fx.idempotency_key)``. The kit runs it
against a local control plane (:class:`controlplane_sdk.testing.FakeControlPlane`) and ``tools``, a
stand-in for your tools that remembers what it committed by idempotency key and injects faults: a
call held in flight while an operator pauses, an ambiguous timeout (committed, then no answer), a
worker killed after its call committed, a lease taken away mid-run. It writes
``conformance.md``, ``conformance.json`` and ``conformance.html``: per scenario, the facts shown from the ledger and the
stand-in's record, and what this kit does not show (the control plane's own share of the test --
timers, child runs, revalidation reports, audit chains -- is shown by the server's suite).

The seven scenarios are those of the operator's run-control test, as far as an agent's code is
responsible for them. A baseline run first learns the agent's calls; each scenario then targets
one of them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ClaimRefused, LeaseLost
from ..loop import run_one
from ..runtime import RunContext, Worker
from ..testing import FakeControlPlane

__all__ = ["ToolStandIn", "WorkerKilled", "run_kit", "main"]

AGENT = "agent-under-test"
RunFn = Callable[[RunContext], Any]
#: what the scenarios run against: a FakeControlPlane, or a LiveControlPlane (``--url``)
NewCp = Callable[[], Any]


class WorkerKilled(BaseException):
    """The stand-in's SIGKILL: raised inside a tool call after it committed; nothing catches it."""


class ToolStandIn:
    """Your tools, as the kit sees them: idempotent by key, with one fault armed at a time."""

    def __init__(self) -> None:
        self.commits: dict[str, int] = {}  # idempotency key -> times the world did it
        self.results: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []  # (tool, action, key), in call order
        self.fault: tuple[int, str, Callable[[], None]] | None = None  # (call no, kind, hook)

    def call(
        self, tool: str, action: str, args: dict[str, Any] | None = None, *, idempotency_key: str
    ) -> dict[str, Any]:
        """Do ``tool:action`` once per key (a repeat answers what the first did)."""
        self.calls.append((tool, action, idempotency_key))
        n = len(self.calls)
        if idempotency_key not in self.results:
            self.commits[idempotency_key] = 1
            ref = f"{tool}-{action}-{len(self.results) + 1}"
            self.results[idempotency_key] = {"id": ref, "tool": tool, "action": action,
                                             "args": dict(args or {})}  # fmt: skip
        if self.fault is not None and self.fault[0] == n:
            _, kind, hook = self.fault
            self.fault = None
            hook()  # e.g. the operator pauses while this call is in flight
            if kind == "timeout":
                raise TimeoutError(f"{tool}:{action} accepted but no answer (injected)")
            if kind == "kill":
                raise WorkerKilled(f"worker killed during {tool}:{action} (injected)")
        return dict(self.results[idempotency_key])

    def arm(self, call_no: int, kind: str, hook: Callable[[], None] = lambda: None) -> None:
        self.fault = (call_no, kind, hook)

    def duplicates(self, plan: list[tuple[str, str]]) -> dict[str, int]:
        """Calls done more often than the baseline made them (per tool:action, whatever the key):
        what the world would hold twice."""
        done: dict[str, int] = {}
        for r in self.results.values():
            done[f"{r['tool']}:{r['action']}"] = done.get(f"{r['tool']}:{r['action']}", 0) + 1
        wanted: dict[str, int] = {}
        for t, a in plan:
            wanted[f"{t}:{a}"] = wanted.get(f"{t}:{a}", 0) + 1
        return {k: n for k, n in done.items() if n > wanted.get(k, 0)}


@dataclass
class Scenario:
    number: int
    title: str
    status: str = "failed"  # passed | failed | error
    shown: list[str] = field(default_factory=list)
    not_shown: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


class Check:
    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario

    def that(self, ok: bool, fact: str) -> None:
        if not ok:
            raise AssertionError(fact)
        self.s.shown.append(fact)


def _list(twice: dict[str, int]) -> str:
    return (
        "" if not twice else " -- done twice: " + ", ".join(f"{k} x{n}" for k, n in twice.items())
    )


def _new_run(cp: Any, build: Callable[[ToolStandIn], RunFn]) -> str:
    """A run for the agent, with the input its builder asks for (``build.run_input``)."""
    agent = getattr(cp, "agent", AGENT)
    return str(cp.create_run(agent, input=dict(getattr(build, "run_input", None) or {})))


def _attempt(cp: Any, run: str, run_fn: RunFn) -> tuple[str, RunContext]:
    worker = Worker(cp.client(), "kit-worker", getattr(cp, "agent", AGENT))
    deadline = time.monotonic() + getattr(cp, "claim_wait_s", 0.0)
    while True:  # a live server may hold a retried run back a moment (its retry backoff)
        try:
            ctx = worker.claim(run, heartbeat=False)
            break
        except ClaimRefused:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.25)
    return run_one(ctx, run_fn).outcome, ctx


def _requeue(cp: Any, run: str, c: Check) -> None:
    """A recovered run the control plane held back for an operator (a live server pauses a run
    whose lost attempt left an effect in flight) is resumed, as the operator would."""
    if cp.state(run) == "paused":
        c.s.shown.append("recovery held the run paused for an operator (an effect was in flight)")
        cp.resume(run, "conformance: the in-flight effect is accounted for")


def _world_keys(cp: FakeControlPlane, run: str, tools: ToolStandIn) -> list[str]:
    return [e["idempotency_key"] for e in cp.effects(run) if e["idempotency_key"] in tools.results]


def _s1_pause_in_flight(
    build: Callable[[ToolStandIn], RunFn], plan: list[Any], c: Check, new_cp: NewCp
) -> None:
    cp, tools = new_cp(), ToolStandIn()
    run, target = _new_run(cp, build), max(1, len(plan) // 2)
    tools.arm(target, "slow", lambda: cp.pause(run, "conformance: pause while a call is in flight"))
    outcome, _ = _attempt(cp, run, build(tools))
    c.that(outcome == "paused", f"the attempt stopped on the pause (run_one: {outcome})")
    c.that(len(tools.calls) == target, f"no call after the in-flight one ({len(tools.calls)} made)")
    fx = cp.effects(run)
    c.that(
        fx[-1]["status"] == "committed", "the in-flight call's outcome was recorded after the pause"
    )
    c.that(cp.state(run) == "paused", "the worker acknowledged the pause (the run is paused)")
    c.s.not_shown += [
        "timers, child runs and authority during the pause (the control plane's share)"
    ]


def _s2_resume(
    build: Callable[[ToolStandIn], RunFn], plan: list[Any], c: Check, new_cp: NewCp
) -> None:
    cp, tools = new_cp(), ToolStandIn()
    run = _new_run(cp, build)
    tools.arm(max(1, len(plan) // 2), "slow", lambda: cp.pause(run, "conformance: pause"))
    _attempt(cp, run, build(tools))
    cp.resume(run)
    outcome, ctx = _attempt(cp, run, build(tools))
    c.that(outcome == "succeeded", f"the resumed attempt (attempt {ctx.attempt.number}) succeeded")
    twice = tools.duplicates(plan)
    c.that(not twice, f"no effect was done twice (the tools hold each call once){_list(twice)}")
    c.that(len(tools.results) == len(plan), f"all {len(plan)} calls happened, once each")
    c.s.not_shown += ["the revalidation report and a blocked resume (the control plane's share)"]


def _s3_cancel(
    build: Callable[[ToolStandIn], RunFn], plan: list[Any], c: Check, new_cp: NewCp
) -> None:
    cp, tools = new_cp(), ToolStandIn()
    run = _new_run(cp, build)
    tools.arm(1, "slow", lambda: cp.cancel(run, "conformance: cancel after the first effect"))
    outcome, _ = _attempt(cp, run, build(tools))
    c.that(outcome == "cancelled", f"the attempt stopped on the cancel (run_one: {outcome})")
    c.that(len(tools.calls) == 1, "no later call executed")
    first = cp.effects(run)[0]
    c.that(first["status"] == "committed", "the first effect is still listed as committed")
    c.that(cp.state(run) == "cancelled", "the run is cancelled")


def _s4_ambiguous(
    build: Callable[[ToolStandIn], RunFn], plan: list[Any], c: Check, new_cp: NewCp
) -> None:
    cp, tools = new_cp(), ToolStandIn()
    run = _new_run(cp, build)
    tools.arm(len(plan), "timeout")
    outcome, _ = _attempt(cp, run, build(tools))
    effect = cp.effects(run)[-1]
    c.that(effect["status"] == "unknown", "the timed-out call is recorded unknown")
    c.that(outcome == "failed", "the attempt did not claim success")
    try:
        cp.retry(run)
        refused = False
    except ValueError:
        refused = True
    c.that(refused, "a retry is refused until the unknown effect is reconciled")
    key = effect["idempotency_key"]
    c.that(key in tools.results, "asking the tools by idempotency key finds the call committed")
    cp.reconcile(effect["id"], "committed", tools.results[key]["id"])
    cp.retry(run)
    outcome, ctx = _attempt(cp, run, build(tools))
    c.that(outcome == "succeeded", f"the new attempt ({ctx.attempt.id}) succeeded")
    twice = tools.duplicates(plan)
    c.that(not twice, f"it reused the key: the tools hold exactly one such call{_list(twice)}")


def _s5_compensate(
    build: Callable[[ToolStandIn], RunFn], plan: list[Any], c: Check, new_cp: NewCp
) -> None:
    cp, tools = new_cp(), ToolStandIn()
    run = _new_run(cp, build)
    _attempt(cp, run, build(tools))
    fx = cp.effects(run)
    described = [e for e in fx if e.get("compensation") or e.get("irreversible")]
    c.that(bool(fx), f"the ledger lists the {len(fx)} completed effects")
    c.s.shown.append(
        f"{len(described)} of {len(fx)} effects name a compensation or are marked irreversible"
        + ("" if len(described) == len(fx) else " (declare compensate= or irreversible=True)")
    )
    c.s.not_shown += ["executing the compensation plan (the control plane's share)"]


def _s6_transfer(
    build: Callable[[ToolStandIn], RunFn], plan: list[Any], c: Check, new_cp: NewCp
) -> None:
    cp, tools = new_cp(), ToolStandIn()
    run = _new_run(cp, build)
    tools.arm(1, "slow", lambda: cp.expire_lease(run))  # the lease moves while the call runs
    outcome, old = _attempt(cp, run, build(tools))
    # paused: a live server holds a recovered run with a call in flight for an operator, and an
    # agent that asks again (the MCP gateway re-claims) hears the run is paused, and stops
    stopped = ("lease_lost", "failed") + (("paused",) if cp.state(run) == "paused" else ())
    c.that(outcome in stopped, f"the former owner stopped (run_one: {outcome})")
    late = [e for e in cp.effects(run)[1:] if e.get("attempt_id") == old.attempt.id]
    c.that(not late, "it declared no further effect under its lost lease")
    if len(tools.calls) > 1:  # e.g. a gateway that claimed the run again, as a new attempt
        c.s.shown.append(f"it went on only as a new attempt ({len(tools.calls) - 1} later calls)")
    try:
        old.client.checkpoint(run, old.fencing_token, "zombie", {})
        zombie = False
    except LeaseLost:
        zombie = True
    c.that(zombie, "a write with its old fencing token is refused")
    if cp.state(run) not in ("succeeded", "failed"):
        _requeue(cp, run, c)
        outcome, _ = _attempt(cp, run, build(tools))
    else:
        outcome = cp.state(run)
    c.that(outcome in ("succeeded", "failed"), f"the new owner ran the run ({outcome})")
    c.s.not_shown += ["assignment and decision authority records (the control plane's share)"]


def _s7_killed(
    build: Callable[[ToolStandIn], RunFn], plan: list[Any], c: Check, new_cp: NewCp
) -> None:
    cp, tools = new_cp(), ToolStandIn()
    run, target = _new_run(cp, build), max(1, len(plan) // 2)
    tool, action = plan[target - 1]
    cp.lose_outcome(tool, action)  # a SIGKILL: the outcome never reaches the ledger
    tools.arm(target, "kill")
    try:
        _attempt(cp, run, build(tools))
        killed = False
    except WorkerKilled:
        killed = True
    c.that(killed, f"the worker died during call {target} ({tool}:{action}), after it committed")
    cp.expire_lease(run)
    orphan = [e for e in cp.effects(run) if e["status"] in ("unknown", "in_flight")]
    seen = ", ".join(f"{e['action']}: {e['status']}" for e in cp.effects(run))
    c.that(len(orphan) == 1, f"the orphaned effect has no known outcome ({seen})")
    lost, key = orphan[0], orphan[0]["idempotency_key"]
    c.that(key in tools.results, "asking the tools by its idempotency key finds the call committed")
    cp.reconcile(lost["id"], "committed", tools.results[key]["id"])
    _requeue(cp, run, c)
    outcome, ctx = _attempt(cp, run, build(tools))
    start = ctx.start_checkpoint.step if ctx.start_checkpoint else "the start"
    c.that(outcome == "succeeded", f"a new attempt rebuilt from {start!r} and completed")
    _no_duplicate_after_recovery(cp, run, tools, plan, lost, c)
    c.s.not_shown += ["detection by lease expiry and the history chain (the control plane's share)"]


def _no_duplicate_after_recovery(
    cp: Any, run: str, tools: ToolStandIn, plan: list[Any], lost: dict[str, Any], c: Check
) -> None:
    """Scenario 7's closing facts, from the ledger and the tools' record: the orphan reconciled,
    nothing left without an outcome, and every call done once."""
    fx = {e["id"]: e for e in cp.effects(run)}
    now = fx.get(lost["id"], {})
    ref = tools.results[lost["idempotency_key"]]["id"]
    c.that(
        now.get("status") == "committed" and bool(now.get("reconciled", True)),
        f"the orphaned effect ({lost['tool']}:{lost['action']}) is reconciled in the ledger: "
        f"committed as {now.get('external_ref') or ref} (was {lost['status']})",
    )
    open_ = [f"{e['action']}: {e['status']}" for e in fx.values()
             if e["status"] in ("unknown", "in_flight", "pending")]  # fmt: skip
    c.that(not open_, f"no effect is left without a known outcome{_list_open(open_)}")
    committed: dict[str, int] = {}
    for e in fx.values():
        if e["status"] == "committed":
            name = f"{e['tool']}:{e['action']}"
            committed[name] = committed.get(name, 0) + 1
    wanted: dict[str, int] = {}
    for t, a in plan:
        wanted[f"{t}:{a}"] = wanted.get(f"{t}:{a}", 0) + 1
    extra = {k: n for k, n in committed.items() if n > wanted.get(k, 0)}
    c.that(
        not extra,
        f"the ledger holds each call committed once, as the baseline made them{_list(extra)}",
    )
    twice = tools.duplicates(plan)
    c.that(not twice, f"no effect was done twice: the tools hold each call once{_list(twice)}")
    sent = sum(1 for *_, k in tools.calls if k == lost["idempotency_key"])
    c.s.shown.append(
        "the orphaned call was not sent to the tools again (replayed from the ledger)"
        if sent == 1
        else f"the orphaned call reached the tools {sent} times, under one idempotency key"
    )


def _list_open(open_: list[str]) -> str:
    return "" if not open_ else " -- open: " + ", ".join(open_)


SCENARIOS = [
    (1, "Pause during an in-flight side effect", _s1_pause_in_flight),
    (2, "Resume after a pause", _s2_resume),
    (3, "Cancel after one effect commits", _s3_cancel),
    (4, "Retry an ambiguous timeout", _s4_ambiguous),
    (5, "Compensate a partially completed run", _s5_compensate),
    (6, "Transfer ownership (the lease moves)", _s6_transfer),
    (7, "Recover after a worker disappears", _s7_killed),
]


def run_kit(
    build: Callable[[ToolStandIn], RunFn],
    name: str = "agent",
    *,
    control_plane: NewCp = FakeControlPlane,
    where: str = "the in-memory control plane",
    only: set[int] | None = None,
) -> dict[str, Any]:
    """Run the seven scenarios against ``build``; returns the evidence (what ``main`` writes).
    ``control_plane`` makes a fresh control plane per scenario (default: in memory); ``only``
    runs just those scenario numbers (the baseline run always)."""
    new_cp = control_plane
    cp, tools = new_cp(), ToolStandIn()
    run = _new_run(cp, build)
    baseline, _ = _attempt(cp, run, build(tools))
    plan = [(t, a) for t, a, _ in tools.calls]
    results = []
    for number, title, fn in SCENARIOS:
        if only and number not in only:
            continue
        s, t0 = Scenario(number, title), time.monotonic()
        if baseline != "succeeded" or not plan:
            s.status, s.error = "error", f"the baseline run did not succeed with calls ({baseline})"
        else:
            try:
                fn(build, plan, Check(s), new_cp)
                s.status = "passed"
            except AssertionError as err:
                s.error = f"not shown: {err}"
            except Exception as err:  # the agent raised where the kit did not expect it
                s.status, s.error = "error", f"{type(err).__name__}: {err}"
        s.seconds = round(time.monotonic() - t0, 3)
        results.append(s)
    return {"agent": name, "control_plane": where, "baseline": {"outcome": baseline, "calls": plan},
            "passed": sum(s.status == "passed" for s in results), "total": len(results),
            "scenarios": [asdict(s) for s in results]}  # fmt: skip


def markdown(evidence: dict[str, Any]) -> str:
    lines = [f"# Run-control conformance: {evidence['agent']}", "",
             f"{evidence['passed']} of {evidence['total']} scenarios passed against "
             f"{evidence.get('control_plane', 'the in-memory control plane')}. Baseline calls: "
             + ", ".join(f"`{t}:{a}`" for t, a in evidence["baseline"]["calls"]), ""]  # fmt: skip
    for s in evidence["scenarios"]:
        lines += [f"## {s['number']}. {s['title']}: {s['status']}", ""]
        lines += [f"- shown: {fact}" for fact in s["shown"]]
        lines += [f"- **{s['error']}**"] if s["error"] else []
        lines += [f"- not shown by this kit: {x}" for x in s["not_shown"]]
        lines.append("")
    return "\n".join(lines)


def html(evidence: dict[str, Any]) -> str:
    """The same evidence as one self-contained HTML page (no scripts, no external assets)."""
    from html import escape

    colour = {"passed": "#1a7f37", "failed": "#cf222e", "error": "#9a6700"}
    parts = [
        "<!doctype html><meta charset=utf-8>",
        f"<title>Run-control conformance: {escape(evidence['agent'])}</title>",
        "<style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;"
        "padding:0 1rem}h2{font-size:1.1rem;margin-top:1.5rem}.s{font-weight:600}"
        "li.no{color:#57606a}</style>",
        f"<h1>Run-control conformance: {escape(evidence['agent'])}</h1>",
        f"<p>{evidence['passed']} of {evidence['total']} scenarios passed against "
        f"{escape(str(evidence.get('control_plane', 'the in-memory control plane')))}. Baseline "
        "calls: " + ", ".join(f"<code>{escape(t)}:{escape(a)}</code>"
                              for t, a in evidence["baseline"]["calls"]) + "</p>",
    ]  # fmt: skip
    for s in evidence["scenarios"]:
        c = colour.get(s["status"], "#57606a")
        parts.append(f"<h2>{s['number']}. {escape(s['title'])}: "
                     f"<span class=s style='color:{c}'>{escape(s['status'])}</span></h2><ul>")  # fmt: skip
        parts += [f"<li>shown: {escape(fact)}</li>" for fact in s["shown"]]
        parts += [f"<li><strong>{escape(s['error'])}</strong></li>"] if s["error"] else []
        parts += [f"<li class=no>not shown by this kit: {escape(x)}</li>" for x in s["not_shown"]]
        parts.append("</ul>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controlplane_sdk.conformance")
    p.add_argument("agent", help="module:function -- build(tools) returning your run function")
    p.add_argument("--out", type=Path, default=Path("reports/conformance"))
    p.add_argument("--url", help="a live control plane instead of the in-memory one")
    p.add_argument("--agent-name", default="", help="with --url: the registered agent to run as")
    p.add_argument("--worker-token-env", default="CONTROLPLANE_TOKEN")
    p.add_argument("--operator-token-env", default="CONTROLPLANE_OPERATOR_TOKEN")
    p.add_argument("--scope", action="append", default=[], help="with --url: authority scopes")
    p.add_argument("--only", type=int, action="append", choices=range(1, 8), metavar="N",
                   help="run only scenario N (repeatable; default: all seven)")  # fmt: skip
    args = p.parse_args(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:
        # the console script (``controlplane-conformance``) finds the author's module where
        # ``python -m`` would: in the current directory
        sys.path.insert(0, os.getcwd())
    module, _, attr = args.agent.partition(":")
    only = set(args.only or ())
    build = getattr(importlib.import_module(module), attr or "build")
    if args.url:
        from .live import LiveControlPlane

        if not args.agent_name:
            p.error("--url needs --agent-name (an agent registered on that control plane)")
        worker, operator = (
            os.environ.get(args.worker_token_env),
            os.environ.get(args.operator_token_env),
        )
        if not worker or not operator:
            p.error(f"set {args.worker_token_env} and {args.operator_token_env}")
        url, agent, scopes = args.url, args.agent_name, args.scope or ["*"]

        def live() -> LiveControlPlane:
            return LiveControlPlane(url, worker, operator, agent=agent, scopes=scopes)

        evidence = run_kit(build, args.agent, control_plane=live, where=url, only=only)
    else:
        evidence = run_kit(build, args.agent, only=only)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conformance.json").write_text(json.dumps(evidence, indent=2))
    (args.out / "conformance.md").write_text(markdown(evidence))
    (args.out / "conformance.html").write_text(html(evidence))
    print(f"{evidence['passed']}/{evidence['total']} passed; evidence in {args.out}")
    return 0 if evidence["passed"] == evidence["total"] else 1
