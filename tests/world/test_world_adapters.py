"""The control-plane adapters against a live world (no database: only settings.WORLD_URL is set)."""

from __future__ import annotations

import time

import pytest

import world.adapters as adapters
from interventions import registry
from interventions.registry import EffectInfo
from world.client import WorldClient

pytestmark = pytest.mark.usefixtures("world_settings")


def effect(tool: str, action: str, key: str, **kw) -> EffectInfo:
    return EffectInfo(tool=tool, action=action, idempotency_key=key, args=kw.pop("args", {}), **kw)


def test_registrations(settings):
    assert "world.adapters" in settings.CONTROLPLANE_ADAPTERS
    for tool, action in [
        ("inventory", "reserve"),
        ("shipping", "create_label"),
        ("payments", "charge"),
        ("notifications", "enqueue"),
    ]:
        assert registry.get_compensator(tool, action) is adapters._compensate
    for tool in ("inventory", "shipping", "payments", "notifications"):
        assert registry.get_reconciler(tool) is adapters.reconcile
    assert registry.get_assumption_checker("price") and registry.get_assumption_checker("stock")


def _compensate(info: EffectInfo, key: str):
    return registry.get_compensator(info.tool, info.action)(info, key)


def test_release_reservation_by_external_ref_is_idempotent(world: WorldClient):
    res = world.reserve("sku-2", 3, "eff-reserve", order="o1")
    info = effect(
        "inventory",
        "reserve",
        "eff-reserve",
        args={"sku": "sku-2", "qty": 3},
        external_ref=res["reservation_id"],
    )
    first = _compensate(info, "eff-reserve:compensate")
    assert first.ok and first.external_ref == res["reservation_id"]
    assert first.detail["status"] == "released"
    again = _compensate(info, "eff-reserve:compensate")
    assert again.ok and again.detail["replayed"] is True
    assert world.get_item("sku-2")["stock"] == 20
    assert world.counts()["reservations"]["undo_by_key"] == {"eff-reserve:compensate": 1}


def test_refund_from_outcome_detail_and_from_by_key(world: WorldClient):
    a = world.charge(20, "eff-charge-a")
    ok = _compensate(
        effect("payments", "charge", "eff-charge-a", outcome_detail={"charge_id": a["charge_id"]}),
        "refund-a",
    )
    assert ok.ok and ok.external_ref.startswith("re_")
    # no reference recorded at all (e.g. reconciled as committed): the world's record under the key
    world.charge(30, "eff-charge-b")
    ok = _compensate(effect("payments", "charge", "eff-charge-b"), "refund-b")
    assert ok.ok and ok.detail["amount"] == 30
    assert world.counts()["charges"]["refunded"] == 2


def test_nothing_to_compensate_is_final(world: WorldClient):
    result = _compensate(effect("payments", "charge", "never-charged"), "refund-x")
    assert not result.ok and not result.retryable and result.detail["error"] == "no_reference"
    result = _compensate(effect("inventory", "reserve", "k", external_ref="res_missing"), "rel-x")
    assert not result.ok and not result.retryable and result.detail["status"] == 404


def test_void_label(world: WorldClient):
    label = world.create_label("o1", "1 Main St", "eff-label")
    result = _compensate(
        effect("shipping", "create_label", "eff-label", external_ref=label["label_id"]), "void-1"
    )
    assert result.ok and result.detail["status"] == "voided"


def test_cancel_notification_queued_then_sent(world: WorldClient, send_delay):
    queued = world.enqueue_notification("c@example.com", "shipped", "eff-n1")
    result = _compensate(
        effect("notifications", "enqueue", "eff-n1", external_ref=queued["notification_id"]),
        "cancel-1",
    )
    assert result.ok and result.detail["status"] == "cancelled"
    sent = world.enqueue_notification("c@example.com", "shipped", "eff-n2")
    time.sleep(send_delay + 0.1)
    result = _compensate(
        effect("notifications", "enqueue", "eff-n2", external_ref=sent["notification_id"]),
        "cancel-2",
    )
    assert not result.ok and result.retryable is False and result.detail["error"] == "already_sent"


def test_compensation_failures_that_may_be_retried(world: WorldClient):
    charge = world.charge(10, "eff-c")
    info = effect("payments", "charge", "eff-c", external_ref=charge["charge_id"])
    world.set_fault("payments", "down", count=1)
    down = _compensate(info, "refund-c")
    assert not down.ok and down.retryable and down.detail["ambiguous"] is False
    world.set_fault("payments", "reject", action="refund", count=1)
    rejected = _compensate(info, "refund-c")
    assert not rejected.ok and rejected.retryable and rejected.detail["body"]["injected"] is True
    world.set_fault("payments", "timeout", action="refund", count=1, delay_ms=1500)
    timed_out = _compensate(info, "refund-c")  # WORLD_TIMEOUT_S is 0.5 in these tests
    assert not timed_out.ok and timed_out.retryable and timed_out.detail["ambiguous"] is True
    retried = _compensate(
        info, "refund-c"
    )  # the timed-out refund had committed: replayed, not doubled
    assert retried.ok and retried.detail["replayed"] is True
    assert world.counts()["charges"]["amount_refunded"] == 10


def test_reconcile_outcomes(world: WorldClient):
    reconcile = registry.get_reconciler("payments")
    charge = world.charge(10, "rc-1")
    committed = reconcile("payments", "charge", "rc-1")
    assert committed.outcome == "committed" and committed.external_ref == charge["charge_id"]
    assert committed.evidence["status_code"] == 201
    with pytest.raises(Exception):  # noqa: B017 -- the world refuses; the reconciler is under test
        world.charge(9000, "rc-2")
    assert reconcile("payments", "charge", "rc-2").outcome == "failed"
    assert reconcile("payments", "charge", "rc-3").outcome == "not_found"
    assert (
        reconcile("payments", "refund", "rc-1").outcome == "unknown"
    )  # key used by another action
    world.set_fault("payments", "down", action="by_key", count=1)
    assert reconcile("payments", "charge", "rc-1").outcome == "unknown"
    world.set_fault("payments", "timeout", action="by_key", count=1, delay_ms=1500)
    timed_out = reconcile("payments", "charge", "rc-1")
    assert timed_out.outcome == "unknown" and timed_out.evidence["error"] == "timeout"


def test_reconcile_ambiguous_charge(world: WorldClient):
    world.set_fault("inventory", "timeout", action="reserve", count=1, drop=True)
    with pytest.raises(Exception):  # noqa: B017 -- the dropped answer; the reconciler is under test
        world.reserve("sku-1", 2, "amb-reserve")
    result = registry.get_reconciler("inventory")("inventory", "reserve", "amb-reserve")
    assert result.outcome == "committed" and result.external_ref.startswith("res_")


def test_world_url_is_read_at_call_time(world: WorldClient, settings):
    settings.WORLD_URL = "http://127.0.0.1:9"
    assert registry.get_reconciler("payments")("payments", "charge", "x").outcome == "unknown"


def test_price_checker(world: WorldClient):
    check = registry.get_assumption_checker("price")
    assert check("price:sku-1", 12.5, {}).ok
    world.set_price("sku-1", 12.9)
    changed = check("price:sku-1", 12.5, {})
    assert not changed.ok and changed.current_value == 12.9 and "12.5" in changed.detail
    assert check("price:sku-1", 12.5, {"tolerance": 0.5}).ok
    assert check("price:sku-1", 12.5, {"tolerance_pct": 5}).ok
    assert not check("price:sku-1", 12.5, {"tolerance_pct": 1}).ok
    world.set_price("sku-1", 10.0)
    assert not check("price:sku-1", 12.5, {}).ok
    assert check("price:sku-1", 12.5, {"allow_decrease": True}).ok
    assert not check("price:sku-404", 1.0, {}).ok


def test_stock_checker(world: WorldClient):
    check = registry.get_assumption_checker("stock")
    assert check("stock:sku-3", 5, {"need": 5}).ok
    world.reserve("sku-3", 2, "someone-else")
    short = check("stock:sku-3", 5, {"need": 5})
    assert not short.ok and short.current_value == 3
    assert check("stock:sku-3", 5, {}).ok  # need defaults to 1
    assert not check("stock:sku-5", 0, {}).ok  # sku-5 is seeded out of stock


def test_checker_when_world_is_down(world: WorldClient):
    world.set_fault("inventory", "down")
    result = registry.get_assumption_checker("price")("price:sku-1", 12.5, {})
    assert not result.ok and result.current_value is None and "could not check" in result.detail
