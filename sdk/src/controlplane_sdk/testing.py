"""An in-memory control plane for an agent author's unit tests: no server, no database, no network.

It answers the worker protocol (the calls :class:`~controlplane_sdk.Client` makes) from memory, with
the server's rules: a paused run's declarations are refused, a key is replayed, an outcome nobody
knows blocks a successful finish, a lost lease refuses every write. The test plays the operator::

    from controlplane_sdk.testing import FakeControlPlane

    def test_a_pause_stops_before_the_charge():
        cp = FakeControlPlane()
        run = cp.create_run("purchasing", input={"sku": "sku-1"}, scopes=["inventory:*", "payments:*"])
        cp.pause_after_step(run, "reserve", reason="check the order")   # at the next boundary
        summary = run_one(Worker(cp.client(), "w", "purchasing").claim(run), purchase)
        assert summary.outcome == "paused" and cp.state(run) == "paused"
        assert [e["action"] for e in cp.effects(run)] == ["reserve"]

Operator controls: :meth:`pause` / :meth:`pause_after_step` (honoured at the agent's next step
boundary), :meth:`resume`, :meth:`cancel`, :meth:`deny` (refuse an effect), :meth:`require_approval`
with :meth:`approve` / :meth:`reject`, :meth:`expire_lease` (the worker's lease is gone, the run is
queued again for another worker), :meth:`lose_outcome` (an effect's outcome never reaches the ledger:
it is ``unknown`` until :meth:`reconcile`). Inspection: :meth:`state`, :meth:`effects`,
:meth:`history`, :attr:`audit` (every refusal, like the server's audit log). ``cp.requests`` lists
the calls the SDK made (``"POST /runs/r1/effects"``), for cost assertions.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from typing import Any

import httpx

from ._fake_protocol import _LEASED, JSON, FakeProtocol, FakeRun
from .client import Client

__all__ = ["FakeControlPlane", "FakeRun"]


class FakeControlPlane(FakeProtocol):
    """An in-memory control plane (see the module docstring). Thread-safe."""

    def __init__(self, *, lease_ttl_s: float = 30.0) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.runs: dict[str, FakeRun] = {}
        self.ledger: list[JSON] = []
        self.audit: list[JSON] = []
        self.requests: list[str] = []
        self._denials: dict[tuple[str, str], str] = {}
        self._approval_needed: set[tuple[str, str]] = set()
        self._lost: set[tuple[str, str]] = set()
        self._lost_effects: set[str] = set()
        self._ids = itertools.count(1)
        self._tokens = itertools.count(1)
        self._lock = threading.RLock()

    # -- wiring -------------------------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        """An ``httpx`` transport into this control plane (sync and async clients alike)."""
        return httpx.MockTransport(self._handle)

    def client(self, **kw: Any) -> Client:
        """A :class:`Client` talking to this control plane (no retry pauses)."""
        kw.setdefault("backoff", 0)
        kw.setdefault("sleep", lambda _s: None)
        return Client("http://controlplane.test", "test-token", transport=self.transport(), **kw)

    # -- the operator's side ------------------------------------------------------------------------

    def create_run(
        self,
        agent: str,
        goal: str = "test run",
        input: JSON | None = None,
        *,
        scopes: Iterable[str] = ("*",),
    ) -> str:
        """A queued run with authority for ``scopes`` (``"payments:charge"``, ``"payments:*"``)."""
        with self._lock:
            return self._create(agent, goal, input or {}, list(scopes)).id

    def pause(self, run_id: str, reason: str = "paused by a test") -> None:
        """Pause now: the worker is told at its next boundary; declarations are refused meanwhile."""
        with self._lock:
            run = self.runs[run_id]
            leased = run.lease is not None and run.lease["status"] == "active"
            target = "pausing" if leased and run.state in _LEASED else "paused"
            self._move(run, target, reason, "pause")

    def pause_after_step(self, run_id: str, step: str, reason: str = "paused by a test") -> None:
        """Pause as soon as the agent completes ``step`` (so its next boundary stops it)."""
        with self._lock:
            self.runs[run_id].pause_after[step] = reason

    def resume(self, run_id: str, reason: str = "resumed by a test") -> None:
        """A paused run is queued again (its revalidation passes); a worker claims a new attempt."""
        with self._lock:
            run = self.runs[run_id]
            if run.state != "paused":
                raise ValueError(f"only a paused run resumes; this one is {run.state}")
            self._move(run, "queued", reason)

    def cancel(self, run_id: str, reason: str = "cancelled by a test") -> None:
        with self._lock:
            run = self.runs[run_id]
            leased = run.lease is not None and run.lease["status"] == "active"
            self._move(run, "cancelling" if leased else "cancelled", reason, "cancel")

    def retry(self, run_id: str, reason: str = "retried by a test") -> None:
        """A failed run is queued for a new attempt -- refused while an effect's outcome is
        unknown (as the server refuses it: reconcile first)."""
        with self._lock:
            run = self.runs[run_id]
            open_ = [
                e["id"] for e in self.effects(run_id) if e["status"] in ("in_flight", "unknown")
            ]
            if open_:
                self._refuse("run.retry", run_id, "effects_unresolved", effects=open_)
                raise ValueError(f"effects_unresolved: reconcile {', '.join(open_)} first")
            if run.state != "failed":
                raise ValueError(f"only a failed run is retried; this one is {run.state}")
            self._move(run, "queued", reason, "retry")

    def deny(self, tool: str, action: str = "*", reason: str = "authority_revoked") -> None:
        """Refuse every later declaration of ``tool:action`` with ``reason``."""
        with self._lock:
            self._denials[(tool, action)] = reason

    def require_approval(self, tool: str, action: str = "*") -> None:
        """``tool:action`` is refused (``approval_required``) unless it cites an approved request."""
        with self._lock:
            self._approval_needed.add((tool, action))

    def approve(self, approval_id: str | None = None, reason: str = "approved by a test") -> None:
        self._decide(approval_id, "approved", reason)

    def reject(self, approval_id: str | None = None, reason: str = "rejected by a test") -> None:
        self._decide(approval_id, "rejected", reason)

    def pending_approvals(self, run_id: str | None = None) -> list[JSON]:
        with self._lock:
            return [
                dict(a)
                for r in self.runs.values()
                if run_id in (None, r.id)
                for a in r.approvals
                if a["status"] == "pending"
            ]

    def expire_lease(self, run_id: str) -> None:
        """The worker's lease runs out (as if it stopped heartbeating): every later write with it
        is refused ``lease_lost``; an effect it left in flight becomes ``unknown``; the run is
        queued again for another worker (recovery)."""
        with self._lock:
            run = self.runs[run_id]
            if run.lease is not None:
                run.lease["status"] = "expired"
            for e in self.ledger:
                if e["run"] == run_id and e["status"] == "in_flight":
                    e["status"] = "unknown"
            target = "paused" if run.state == "pausing" else "queued"
            if run.state in _LEASED:
                self._move(run, target, "the lease expired; recovery queued the run again")

    def lose_outcome(self, tool: str, action: str = "*") -> None:
        """The next outcome of ``tool:action`` never reaches the ledger (the network ate it): the
        SDK raises ``OutcomeNotRecorded`` and the effect is ``unknown`` until :meth:`reconcile`."""
        with self._lock:
            self._lost.add((tool, action))

    def reconcile(self, effect_id: str, outcome: str, external_ref: str = "") -> None:
        """What an operator does with an ``unknown`` effect once the world has been asked."""
        with self._lock:
            e = self._effect(effect_id)
            e["status"], e["external_ref"] = outcome, external_ref or e.get("external_ref")
            e["reconciled"] = True
            self._lost_effects.discard(effect_id)

    # -- inspection ---------------------------------------------------------------------------------

    def state(self, run_id: str) -> str:
        return self.runs[run_id].state

    def checkpoints(self, run_id: str) -> list[JSON]:
        with self._lock:
            return [dict(c) for c in self.runs[run_id].checkpoints]
