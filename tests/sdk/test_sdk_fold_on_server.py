"""The SDK's fewest-round-trips path against the real server (views, services, PostgreSQL): an effect's
outcome carries the step's checkpoint and the next declaration (``fx.then``), and the next
``ctx.effect`` uses the carried decision instead of declaring again."""

from __future__ import annotations

import httpx
import pytest
from django.test import Client as DjangoClient

from controlplane_sdk import Client, EffectDenied, RunContext, Worker
from controlplane_sdk.loop import run_one
from runs.models import Checkpoint, Effect, HistoryEvent, Run
from tests.conftest import Api, start_run
from tests.interventions.helpers import intervene

pytestmark = pytest.mark.django_db


class Wire:
    """An httpx transport into the Django app in-process; remembers every call."""

    def __init__(self) -> None:
        self.django = DjangoClient()
        self.calls: list[tuple[str, str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        import json

        path = request.url.raw_path.decode()
        body = json.loads(request.content) if request.content else {}
        self.calls.append((request.method, path.removeprefix("/api/v1").split("?")[0], body))
        resp = self.django.generic(
            request.method,
            path,
            data=request.content,
            content_type=request.headers.get("content-type", "application/json"),
            HTTP_AUTHORIZATION=request.headers["authorization"],
        )
        return httpx.Response(
            resp.status_code,
            content=resp.content,
            headers={"content-type": resp.get("Content-Type", "application/json")},
        )


@pytest.fixture
def wire() -> Wire:
    return Wire()


@pytest.fixture
def sdk(wire: Wire, worker_token: str) -> Client:
    return Client("http://cp.test", worker_token, transport=httpx.MockTransport(wire), retries=0)


def _claim(sdk: Client, worker_token: str, wire: Wire) -> RunContext:
    run = start_run(Api(DjangoClient(), worker_token))
    ctx = Worker(sdk, "worker-7", "purchasing").claim(run["id"], heartbeat=False)
    wire.calls.clear()
    return ctx


def test_an_outcome_carries_the_checkpoint_and_the_next_declaration(sdk, wire, worker_token):
    ctx = _claim(sdk, worker_token, wire)
    seen: list[str] = []

    def purchase(ctx: RunContext) -> None:
        with ctx.step("reserve"):
            with ctx.effect("inventory", "reserve", args={"sku": "sku-1"}) as fx:
                fx.committed("res-1")
                fx.checkpoint({"reservation": "res-1"})
                charge = fx.then("payments", "charge", step="charge", args={"amount": 100})
        with ctx.step("charge"), charge as fx:
            seen.append(fx.decision)
            fx.committed("ch-1")
            fx.checkpoint({**ctx.state, "charge": "ch-1"})

    summary = run_one(ctx, purchase)

    assert summary.outcome == "succeeded" and seen == ["authorized"]
    calls = [(m, p) for m, p, _ in wire.calls]
    outcomes = [b for m, p, b in wire.calls if p.endswith("/outcome")]
    # one declaration and two outcomes for two effects; no checkpoint call; no heartbeat at the
    # second boundary (the carried authorization stood for it)
    assert sum(p.endswith("/effects") for _, p in calls) == 1
    assert not any(p.endswith("/checkpoints") for _, p in calls)
    # run_one's and the first step's; none at the second
    assert sum(p.endswith("/heartbeat") for _, p in calls) == 2
    assert [("next" in b, b["checkpoint"]["step"]) for b in outcomes] == [
        (True, "reserve"),
        (False, "charge"),
    ]
    run = Run.objects.get(pk=ctx.run_id)
    assert run.state == "succeeded"
    effects = Effect.objects.filter(run=run).order_by("declared_at")
    assert [(e.action, e.status, e.external_ref) for e in effects] == [
        ("reserve", "committed", "res-1"),
        ("charge", "committed", "ch-1"),
    ]
    cps = list(Checkpoint.objects.filter(run=run).order_by("seq").values_list("step", "state"))
    assert cps == [
        ("reserve", {"reservation": "res-1"}),
        ("charge", {"reservation": "res-1", "charge": "ch-1"}),
    ]
    kinds = list(
        HistoryEvent.objects.filter(run=run).order_by("seq").values_list("kind", flat=True)
    )
    i = kinds.index("checkpoint")
    assert kinds[i - 1 : i + 2] == ["effect_outcome", "checkpoint", "effect_intent"]


def test_an_effect_declared_ahead_but_not_dispatched_is_recorded_failed_not_dispatched(
    sdk, wire, worker_token
):
    ctx = _claim(sdk, worker_token, wire)

    def agent(ctx: RunContext) -> None:
        with ctx.effect("inventory", "reserve", step="reserve", args={"sku": "sku-1"}) as fx:
            fx.then("payments", "charge", step="charge", args={"amount": 100})
        # the agent changes its mind: a different amount is a different declaration
        with ctx.effect("payments", "charge", step="charge", key="charge-2", args={"amount": 90}):
            pass

    assert run_one(ctx, agent).outcome == "succeeded"
    by_key = {e.idempotency_key: e for e in Effect.objects.filter(run_id=ctx.run_id)}
    ahead = by_key[f"{ctx.run_id}:charge:payments:charge"]
    assert ahead.status == "failed" and ahead.outcome_detail["not_dispatched"] is True
    assert by_key["charge-2"].status == "committed"
    assert Run.objects.get(pk=ctx.run_id).state == "succeeded"


def test_an_unused_ahead_declaration_does_not_block_finishing(sdk, wire, worker_token):
    ctx = _claim(sdk, worker_token, wire)

    def agent(ctx: RunContext) -> None:
        with ctx.effect("inventory", "reserve", step="reserve", args={"sku": "sku-1"}) as fx:
            fx.then("inventory", "release", step="release", args={"sku": "sku-1"})

    assert run_one(ctx, agent).outcome == "succeeded"
    statuses = dict(Effect.objects.filter(run_id=ctx.run_id).values_list("action", "status"))
    assert statuses == {"reserve": "committed", "release": "failed"}


def test_a_carried_declaration_that_is_denied_raises_at_its_effect_before_dispatch(
    sdk, wire, worker_token
):
    ctx = _claim(sdk, worker_token, wire)
    dispatched: list[int] = []

    def agent(ctx: RunContext) -> None:
        with ctx.effect("inventory", "reserve", step="reserve", args={"sku": "sku-1"}) as fx:
            fx.then("payments", "refund", step="refund", args={"amount": 1})  # no authority
        with ctx.step("refund"):
            with ctx.effect("payments", "refund", args={"amount": 1}):
                dispatched.append(1)

    with pytest.raises(EffectDenied) as denied:
        agent(ctx)
    assert denied.value.reason == "authority_missing" and dispatched == []
    # the refusal came with the outcome: the boundary heartbeated (nothing authorized ahead) and no
    # second declaration was sent
    assert sum(p.endswith("/effects") for _, p, _ in wire.calls) == 1
    assert Effect.objects.get(run_id=ctx.run_id, action="reserve").status == "committed"


def test_a_pause_after_the_carried_authorization_lets_that_effect_finish_then_stops(
    sdk, wire, worker_token, as_user
):
    """The carried authorization came before the pause, so the effect is in flight (the pause
    contract lets it finish, flagged late); the boundary after it honours the pause."""
    ctx = _claim(sdk, worker_token, wire)
    dispatched: list[str] = []

    def agent(ctx: RunContext) -> None:
        with ctx.step("reserve"):
            with ctx.effect("inventory", "reserve", args={"sku": "sku-1"}) as fx:
                charge = fx.then("payments", "charge", step="charge", args={"amount": 100})
        assert intervene(as_user("ian"), ctx.run_id, "pause").status_code == 202
        with ctx.step("charge"), charge:
            dispatched.append("charge")
        with ctx.step("notify"):
            dispatched.append("notify")

    assert run_one(ctx, agent).outcome == "paused"
    assert dispatched == ["charge"]
    charge = Effect.objects.get(run_id=ctx.run_id, action="charge")
    assert (charge.status, charge.late) == ("committed", True)
    assert Run.objects.get(pk=ctx.run_id).state == "paused"
