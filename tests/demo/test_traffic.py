"""The traffic generator keeps an unattended demo producing runs: runs waiting for a human do not fill
its cap, and an agent whose threads are all blocked gets no new runs queued behind them.

Found in a soak of `make run`: after 22 minutes three LangGraph runs waited for approvals nobody gave,
every lg-purchasing thread was blocked, five more lg runs queued behind them, and the global cap of 8
active runs stopped all traffic."""

from __future__ import annotations

import random
from typing import Any

import pytest

from demo_agents import traffic as traffic_mod
from demo_agents.traffic import Traffic


class FakeClient:
    def __init__(self, active: list[dict[str, Any]]):
        self.active, self.created = active, []

    def list_runs(self, **_kw) -> list[dict[str, Any]]:
        return self.active

    def create_run(self, agent, goal, inp, **kw) -> dict[str, Any]:
        self.created.append(agent)
        return {"id": f"run-{len(self.created)}", "goal": goal}


class FakeWorld:
    def list_items(self) -> list[dict[str, Any]]:
        return [{"sku": f"sku-{i}", "price": "12.50", "stock": 100} for i in range(1, 5)]

    def faults(self) -> list:
        return []

    def set_fault(self, *a, **kw) -> None:
        pass

    def set_stock(self, *a) -> None:
        pass


def _traffic(active, **kw) -> tuple[Traffic, FakeClient]:
    client = FakeClient(active)
    options = {"max_active": 8, "max_approvals": 2, "threshold": 200.0} | kw
    return Traffic(client, FakeWorld(), random.Random(7), **options), client  # type: ignore[arg-type]


def _runs(agent: str, state: str, n: int) -> list[dict[str, Any]]:
    return [{"id": f"{agent}-{state}-{i}", "agent": agent, "state": state} for i in range(n)]


def test_runs_waiting_for_approval_do_not_fill_the_cap():
    waiting = _runs("lg-purchasing", "awaiting_approval", 3) + _runs("purchasing", "running", 5)
    t, client = _traffic(waiting)
    assert t.tick() is not None and len(client.created) == 1


def test_the_cap_still_holds_for_runs_that_are_queued_or_running():
    t, client = _traffic(_runs("purchasing", "running", 6) + _runs("purchasing", "queued", 2))
    assert t.tick() is None and client.created == []


@pytest.fixture
def framework_agents(monkeypatch):
    monkeypatch.setenv("DEMO_FRAMEWORK_AGENTS", "1")
    monkeypatch.setattr(traffic_mod, "WEIGHTS", {"ok": 1})  # no faults: only agent routing


def test_a_backlogged_agent_gets_no_new_runs(framework_agents):
    active = _runs("lg-purchasing", "awaiting_approval", 2) + _runs("lg-purchasing", "queued", 1)
    t, client = _traffic(active)
    for _ in range(60):
        t.tick()
    assert "lg-purchasing" not in client.created
    assert {"purchasing", "oa-purchasing"} <= set(client.created)


def test_without_a_backlog_framework_agents_get_runs(framework_agents):
    t, client = _traffic([])
    for _ in range(60):
        t.tick()
    assert "lg-purchasing" in client.created
