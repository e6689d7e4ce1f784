"""The in-memory control plane's side of the worker protocol (``controlplane_sdk.testing``): the
runs it keeps and the answers it gives each call, by the server's rules."""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

JSON = dict[str, Any]
_DIRECTIVES = {
    "running": "continue",
    "awaiting_approval": "wait",
    "pausing": "pause",
    "paused": "pause",
    "cancelling": "cancel",
    "cancelled": "cancel",
}
_DENIAL_BY_STATE = {
    "pausing": "run_paused",
    "paused": "run_paused",
    "cancelling": "run_cancelled",
    "cancelled": "run_cancelled",
}
_LEASED = {"running", "awaiting_approval", "pausing", "cancelling"}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat()


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass
class FakeRun:
    id: str
    agent: str
    goal: str
    input: JSON
    scopes: list[str]
    state: str = "queued"
    reason: str = ""
    attempts: list[JSON] = field(default_factory=list)
    lease: JSON | None = None  # {"id", "fencing_token", "status"}
    checkpoints: list[JSON] = field(default_factory=list)
    history: list[JSON] = field(default_factory=list)
    approvals: list[JSON] = field(default_factory=list)
    pause_after: dict[str, str] = field(default_factory=dict)  # step -> reason
    timers: list[JSON] = field(default_factory=list)  # set, not yet delivered ({name, fire_at})


class FakeProtocol:
    """The routes and rules; :class:`~controlplane_sdk.testing.FakeControlPlane` adds the
    operator's controls and inspection."""

    lease_ttl_s: float
    runs: dict[str, FakeRun]
    ledger: list[JSON]
    audit: list[JSON]
    requests: list[str]
    _denials: dict[tuple[str, str], str]
    _approval_needed: set[tuple[str, str]]
    _lost: set[tuple[str, str]]
    _lost_effects: set[str]
    _ids: itertools.count[int]
    _tokens: itertools.count[int]
    _lock: threading.RLock

    def effects(self, run_id: str, *, denied: bool = False) -> list[JSON]:
        """The run's ledger in order (authorized ones; ``denied=True`` includes the refusals)."""
        with self._lock:
            return [
                dict(e)
                for e in self.ledger
                if e["run"] == run_id and (denied or e["decision"] != "denied")
            ]

    def history(self, run_id: str, kind: str | None = None) -> list[JSON]:
        with self._lock:
            return [dict(h) for h in self.runs[run_id].history if kind in (None, h["kind"])]

    # -- internals ----------------------------------------------------------------------------------

    def _create(self, agent: str, goal: str, input: JSON, scopes: list[str]) -> FakeRun:
        run = FakeRun(f"run-{next(self._ids)}", agent, goal, input, scopes)
        self.runs[run.id] = run
        run.history.append({"kind": "run_created", "data": {}})
        return run

    def _move(self, run: FakeRun, state: str, reason: str, event: str = "") -> None:
        data = {"from": run.state, "to": state, "event": event or state, "reason": reason}
        run.history.append({"kind": "state_changed", "data": data})
        run.state, run.reason = state, reason
        if state not in _LEASED and run.lease is not None and run.lease["status"] == "active":
            run.lease["status"] = "released"

    def _decide(self, approval_id: str | None, status: str, reason: str) -> None:
        with self._lock:
            for run in self.runs.values():
                for a in run.approvals:
                    if a["status"] == "pending" and approval_id in (None, a["id"]):
                        a["status"], a["decision_reason"] = status, reason
                        if run.state == "awaiting_approval":
                            self._move(run, "running", reason)
                        return
            raise ValueError(f"no pending approval {approval_id or ''}".strip())

    def _effect(self, effect_id: str) -> JSON:
        return next(e for e in self.ledger if e["id"] == effect_id)

    def _refuse(self, what: str, run_id: str, reason: str, **context: Any) -> None:
        self.audit.append({"action": what, "run": run_id, "outcome": "denied", "reason": reason,
                           "context": context})  # fmt: skip

    def _lease_ok(self, run: FakeRun, token: Any) -> bool:
        le = run.lease
        return le is not None and le["status"] == "active" and le["fencing_token"] == int(token)

    @staticmethod
    def _matches(
        rules: Iterable[tuple[str, str]], tool: str, action: str
    ) -> tuple[str, str] | None:
        return next((r for r in rules if r[0] == tool and r[1] in ("*", action)), None)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        body = json.loads(request.content) if request.content else {}
        with self._lock:
            self.requests.append(f"{request.method} {path}")
            for method, pattern, fn in self._routes:
                m = re.fullmatch(pattern, path)
                if m and method == request.method:
                    if m.groups() and m.group(1) not in self.runs and "/runs/" in pattern:
                        return httpx.Response(404, json={"error": "not_found", "detail": path})
                    status, payload = fn(self, body, dict(request.url.params), *m.groups())
                    return httpx.Response(status, json=payload)
        return httpx.Response(
            404, json={"error": "not_found", "detail": f"{request.method} {path}"}
        )

    # Route handlers: (self, body, params, *path groups) -> (status, payload).

    def _r_list(self, _b: JSON, q: dict[str, str]) -> tuple[int, Any]:
        runs = [r for r in self.runs.values() if q.get("agent") in (None, r.agent)]
        return 200, {"runs": [self._run_json(r) for r in runs if q.get("state") in (None, r.state)]}

    def _r_create(self, b: JSON, _q: dict[str, str]) -> tuple[int, Any]:
        scopes = [str(a.get("scope")) for a in b.get("authority") or []]
        run = self._create(
            str(b.get("agent")), str(b.get("goal") or ""), b.get("input") or {}, scopes
        )
        return 201, self._run_json(run)

    def _run_json(self, run: FakeRun) -> JSON:
        return {"id": run.id, "agent": run.agent, "goal": run.goal, "input": run.input,
                "state": run.state, "state_reason": run.reason, "attempts": run.attempts,
                "approvals": [dict(a) for a in run.approvals]}  # fmt: skip

    def _r_get(self, _b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        return 200, self._run_json(self.runs[rid])

    def _r_history(self, _b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        return 200, {"events": self.history(rid)}

    def _r_effects(self, _b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        return 200, {"effects": self.effects(rid, denied=True)}

    def _claim_json(self, run: FakeRun, worker: str) -> JSON:
        number = len(run.attempts) + 1
        attempt = {"id": f"{run.id}-a{number}", "number": number, "worker": worker}
        run.attempts.append(attempt)
        token = next(self._tokens)
        run.lease = {"id": f"lease-{token}", "fencing_token": token, "status": "active"}
        self._move(run, "running", f"claimed by {worker}")
        cp = run.checkpoints[-1] if run.checkpoints else None
        return {"run_id": run.id, "attempt": attempt, "directive": "continue",
                "lease": {**run.lease, "ttl_s": self.lease_ttl_s, "expires_at": _now()},
                "checkpoint": cp}  # fmt: skip

    def _r_claim(self, b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        run = self.runs[rid]
        if run.state != "queued":
            code = "lease_held" if run.state in _LEASED else "not_claimable"
            return 409, {"error": code, "detail": f"the run is {run.state}", "state": run.state}
        return 200, self._claim_json(run, str(b.get("worker") or "worker"))

    def _r_work(self, b: JSON, _q: dict[str, str]) -> tuple[int, Any]:
        agents = set(b.get("agents") or [])
        for run in self.runs.values():
            if run.state == "queued" and (not agents or run.agent in agents):
                return 200, {"claim": self._claim_json(run, str(b.get("worker") or "worker"))}
        return 200, {"claim": None}

    def _lease_run(self, lease_id: str) -> FakeRun | None:
        return next((r for r in self.runs.values() if r.lease and r.lease["id"] == lease_id), None)

    def _lost_lease(self, run_id: str, action: str) -> tuple[int, Any]:
        self._refuse(action, run_id, "lease_lost")
        return 409, {"error": "lease_lost", "detail": "this lease is no longer the run's"}

    def _r_heartbeat(self, b: JSON, _q: dict[str, str], lease_id: str) -> tuple[int, Any]:
        run = self._lease_run(lease_id)
        if run is None or not self._lease_ok(run, b.get("fencing_token")):
            return self._lost_lease(run.id if run else "", "lease.heartbeat")
        latest = run.approvals[-1] if run.approvals else None
        # A due timer is delivered once, on a heartbeat; while paused it waits for the resume.
        due = [] if run.state in ("paused", "pausing") else [
            t for t in run.timers if _dt.datetime.fromisoformat(t["fire_at"]) <= _dt.datetime.now(_dt.UTC)
        ]  # fmt: skip
        run.timers = [t for t in run.timers if t not in due]
        return 200, {"directive": _DIRECTIVES.get(run.state, "stop"), "reason": run.reason,
                     "state": run.state, "expires_at": _now(), "approval": latest,
                     "timers_fired": due}  # fmt: skip

    def _r_release(self, b: JSON, _q: dict[str, str], lease_id: str) -> tuple[int, Any]:
        run = self._lease_run(lease_id)
        if run is None or not self._lease_ok(run, b.get("fencing_token")):
            return self._lost_lease(run.id if run else "", "lease.release")
        after = {"pausing": "paused", "cancelling": "cancelled"}.get(run.state)
        if after is None:
            self._refuse("lease.release", run.id, "conflict", state=run.state)
            return 409, {"error": "conflict", "detail": f"nothing to acknowledge: {run.state}"}
        self._move(run, after, str(b.get("reason") or "the worker stopped at a boundary"))
        return 200, {"id": lease_id, "released": True, "state": run.state}

    def _decide_declaration(self, run: FakeRun, b: JSON) -> tuple[int, JSON]:
        tool, action, key = str(b.get("tool")), str(b.get("action")), str(b.get("idempotency_key"))
        args = b.get("args") or {}
        if not self._lease_ok(run, b.get("fencing_token")):
            reason: str | None = "lease_lost"
        else:
            for e in self.ledger:
                if e["run"] == run.id and e["idempotency_key"] == key and e["decision"] != "denied":
                    if _canon([e["tool"], e["action"], e["args"]]) != _canon([tool, action, args]):
                        return 422, {"error": "idempotency_key_reused", "detail": key}
                    return 200, {**e, "decision": "replayed"}
            reason = _DENIAL_BY_STATE.get(run.state) or (
                None if run.state == "running" else "not_running"
            )
        if reason is None and not any(
            s in ("*", f"{tool}:*", f"{tool}:{action}") for s in run.scopes
        ):
            reason = "authority_missing"
        rule = self._matches(self._denials, tool, action)
        if reason is None and rule is not None:
            reason = self._denials[rule]
        if reason is None and self._matches(self._approval_needed, tool, action):
            approved = [a for a in run.approvals if a["id"] == str(b.get("approval_id"))]
            ok = approved and approved[0]["status"] == "approved"
            reason = (
                None if ok and _canon(approved[0]["args"]) == _canon(args) else "approval_required"
            )
        effect = {"id": f"fx-{next(self._ids)}", "run": run.id, "step": b.get("step"),
                  "tool": tool, "action": action, "idempotency_key": key, "args": args,
                  "attempt_id": run.attempts[-1]["id"] if run.attempts else None,
                  "decision": "authorized" if reason is None else "denied",
                  "status": "in_flight" if reason is None else "denied",
                  "external_ref": None, "outcome_detail": None,
                  "compensation": b.get("compensation"),
                  "irreversible": bool(b.get("irreversible"))}  # fmt: skip
        self.ledger.append(effect)
        if reason is not None:
            effect["denial_reason"] = reason
            self._refuse("effect.declare", run.id, reason, tool=tool, action=action, key=key)
            return 409, {
                "error": "denied",
                "decision": "denied",
                "reason": reason,
                "id": effect["id"],
            }
        return 201, dict(effect)

    def _r_declare(self, b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        return self._decide_declaration(self.runs[rid], b)

    def _r_outcome(self, b: JSON, _q: dict[str, str], effect_id: str) -> tuple[int, Any]:
        e = self._effect(effect_id)
        run = self.runs[e["run"]]
        rule = self._matches(self._lost, e["tool"], e["action"])
        if rule is not None and e["status"] == "in_flight":
            self._lost.discard(rule)
            self._lost_effects.add(effect_id)
        if effect_id in self._lost_effects:  # every try of it: the SDK gives up, as it would
            e["status"] = "unknown"  # as recovery finds it: dispatched, outcome never recorded
            raise httpx.ConnectError("the outcome was lost in transit (FakeControlPlane)")
        if e["status"] == "in_flight" or (e["status"] == "unknown" and not e.get("reconciled")):
            # Always recorded, even late or from a lease that expired meanwhile (flagged below).
            e["status"], e["external_ref"] = b.get("status"), b.get("external_ref") or None
            e["outcome_detail"] = b.get("detail") or {}
        answer: JSON = {"id": effect_id, "status": e["status"],
                        "late": run.state != "running", "stale_lease": not self._lease_ok(
                            run, b.get("fencing_token"))}  # fmt: skip
        cp = b.get("checkpoint")
        if cp is not None and b.get("status") == "committed":
            answer["checkpoint"] = self._write_checkpoint(run, b.get("fencing_token"), cp)[1]
        if b.get("next") is not None:
            status, decided = self._decide_declaration(run, b["next"])
            answer["next"] = {**decided, "http_status": status}
        return 200, answer

    def _write_checkpoint(self, run: FakeRun, token: Any, b: JSON) -> tuple[int, JSON]:
        if not self._lease_ok(run, token):
            self._refuse("checkpoint.write", run.id, "lease_lost")
            return 409, {"error": "lease_lost", "detail": "this lease is no longer the run's"}
        cp = {"seq": len(run.checkpoints) + 1, "step": b.get("step"), "state": b.get("state") or {}}
        run.checkpoints.append(cp)
        return 201, dict(cp)

    def _r_checkpoint(self, b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        return self._write_checkpoint(self.runs[rid], b.get("fencing_token"), b)

    def _r_events(self, b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        run = self.runs[rid]
        if not self._lease_ok(run, b.get("fencing_token")):
            return self._lost_lease(rid, "events.append")
        events = list(b.get("events") or [])
        run.history.extend({"kind": e.get("kind"), "data": e.get("data") or {}} for e in events)
        for e in events:
            if e.get("kind") == "timer_set":
                run.timers.append(dict(e.get("data") or {}))
            step = (e.get("data") or {}).get("step")
            if e.get("kind") == "step_completed" and step in run.pause_after:
                self._move(run, "pausing", run.pause_after.pop(step), "pause")
        return 201, {"appended": len(events)}

    def _r_approval(self, b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        run = self.runs[rid]
        if not self._lease_ok(run, b.get("fencing_token")):
            return self._lost_lease(rid, "approval.request")
        approval = {"id": f"ap-{next(self._ids)}", "status": "pending", "tool": b.get("tool"),
                    "action": b.get("action"), "args": b.get("args") or {},
                    "reason": b.get("reason"), "decision_reason": None}  # fmt: skip
        run.approvals.append(approval)
        if run.state == "running":
            self._move(run, "awaiting_approval", str(b.get("reason") or "approval requested"))
        return 201, dict(approval)

    def _r_finish(self, b: JSON, _q: dict[str, str], rid: str) -> tuple[int, Any]:
        run = self.runs[rid]
        if not self._lease_ok(run, b.get("fencing_token")):
            return self._lost_lease(rid, "run.finish")
        outcome = str(b.get("outcome"))
        open_ = [e["id"] for e in self.effects(rid) if e["status"] in ("in_flight", "unknown")]
        if outcome == "succeeded" and open_:
            self._refuse("run.finish", rid, "effects_unresolved", effects=open_)
            return 409, {"error": "effects_unresolved", "effects": open_,
                         "detail": "effects with no known outcome"}  # fmt: skip
        state = "cancelled" if run.state == "cancelling" else outcome
        self._move(run, state, str(b.get("error") or b.get("failure_class") or outcome))
        return 200, {"id": rid, "state": run.state}

    _routes: list[tuple[str, str, Callable[..., tuple[int, Any]]]] = [
        ("GET", r"/runs", _r_list),
        ("POST", r"/runs", _r_create),
        ("GET", r"/runs/([^/]+)", _r_get),
        ("GET", r"/runs/([^/]+)/effects", _r_effects),
        ("GET", r"/runs/([^/]+)/history", _r_history),
        ("POST", r"/runs/([^/]+)/claim", _r_claim),
        ("POST", r"/work/claim", _r_work),
        ("POST", r"/leases/([^/]+)/heartbeat", _r_heartbeat),
        ("POST", r"/leases/([^/]+)/release", _r_release),
        ("POST", r"/runs/([^/]+)/effects", _r_declare),
        ("POST", r"/effects/([^/]+)/outcome", _r_outcome),
        ("POST", r"/runs/([^/]+)/checkpoints", _r_checkpoint),
        ("POST", r"/runs/([^/]+)/events", _r_events),
        ("POST", r"/runs/([^/]+)/approvals", _r_approval),
        ("POST", r"/runs/([^/]+)/finish", _r_finish),
    ]
