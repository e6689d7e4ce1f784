"""Fault injection: each kind does exactly what it promises about commitment."""

from __future__ import annotations

import time

import pytest

from world.client import WorldClient, WorldError, WorldTimeout, WorldUnavailable


def test_timeout_commits_but_caller_gets_no_answer(world: WorldClient):
    world.set_fault("payments", "timeout", action="charge", count=1, delay_ms=1500)
    with WorldClient(world.base_url, timeout=0.3) as impatient:
        with pytest.raises(WorldTimeout) as exc:
            impatient.charge(30, "amb-1")
    assert exc.value.ambiguous is True
    found = world.by_key("payments", "amb-1")
    assert found["committed"] is True  # the ambiguous call DID commit
    # retrying with the same key is safe: the original result, no second charge
    again = world.charge(30, "amb-1")
    assert again["replayed"] is True and again["charge_id"] == found["result"]["charge_id"]
    assert world.counts()["charges"]["by_key"] == {"amb-1": 1}
    first = world.requests(system="payments", action="charge")[0]
    assert first["fault"] == "timeout" and first["committed"] is True


def test_timeout_with_dropped_connection(world: WorldClient):
    world.set_fault("inventory", "timeout", action="reserve", count=1, drop=True)
    start = time.monotonic()
    with pytest.raises(WorldTimeout):
        world.reserve("sku-1", 1, "drop-1")
    assert time.monotonic() - start < 2  # dropped, not slept
    assert world.by_key("inventory", "drop-1")["committed"] is True
    assert world.get_item("sku-1")["stock"] == 99


def test_reject_commits_nothing_and_key_stays_usable(world: WorldClient):
    world.set_fault("payments", "reject", count=1)
    with pytest.raises(WorldError) as exc:
        world.charge(10, "rej-1")
    assert (exc.value.status, exc.value.error, exc.value.injected) == (402, "card_declined", True)
    assert world.by_key("payments", "rej-1")["found"] is False
    assert world.counts()["charges"]["total"] == 0
    assert world.charge(10, "rej-1")["replayed"] is False  # count=1: the fault is used up


def test_reject_custom_status(world: WorldClient):
    world.set_fault("shipping", "reject", status=400, error="address_invalid")
    for key in ("a", "b"):  # persistent
        with pytest.raises(WorldError) as exc:
            world.create_label("o1", "nowhere", key)
        assert (exc.value.status, exc.value.error) == (400, "address_invalid")
    assert world.clear_faults("shipping") == 1
    assert world.create_label("o1", "somewhere", "a")["status"] == "active"


def test_slow_then_normal(world: WorldClient):
    world.set_fault("inventory", "slow", action="get_item", delay_ms=300, count=1)
    start = time.monotonic()
    assert world.get_item("sku-1")["price"] == 12.5
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    world.get_item("sku-1")
    assert time.monotonic() - start < 0.3


def test_slow_beyond_client_timeout_still_commits(world: WorldClient):
    world.set_fault("payments", "slow", action="charge", delay_ms=800, count=1)
    with WorldClient(world.base_url, timeout=0.2) as impatient:
        with pytest.raises(WorldTimeout):
            impatient.charge(10, "slow-1")
    time.sleep(0.8)  # the server wakes up and processes the call
    assert world.by_key("payments", "slow-1")["committed"] is True


def test_down_commits_nothing_and_hits_reads(world: WorldClient):
    world.set_fault("payments", "down")
    with pytest.raises(WorldUnavailable) as exc:
        world.charge(10, "down-1")
    assert exc.value.status == 503 and not exc.value.ambiguous
    with pytest.raises(WorldUnavailable):
        world.by_key("payments", "down-1")
    world.clear_faults()
    assert world.by_key("payments", "down-1")["found"] is False
    assert world.counts()["charges"]["total"] == 0
    recorded = world.requests(system="payments")
    assert [(r["action"], r["status"], r["fault"]) for r in recorded[:2]] == [
        ("charge", 503, "down"),
        ("by_key", 503, "down"),
    ]


def test_fault_scope_and_count(world: WorldClient):
    world.set_fault("inventory", "down", action="reserve", count=2)
    assert len(world.faults()) == 1
    for key in ("x1", "x2"):
        with pytest.raises(WorldUnavailable):
            world.reserve("sku-1", 1, key)
    world.get_item("sku-1")  # other actions unaffected
    world.charge(1, "x1")  # other systems unaffected
    assert world.reserve("sku-1", 1, "x3")["status"] == "active"
    assert world.faults() == []


def test_bad_fault_spec(world: WorldClient):
    with pytest.raises(WorldError) as exc:
        world.set_fault("payments", "explode")
    assert exc.value.status == 400
    with pytest.raises(WorldError):
        world.set_fault("banking", "down")


def test_unreachable_world(world: WorldClient):
    with WorldClient("http://127.0.0.1:9", timeout=0.5) as nowhere:
        with pytest.raises(WorldUnavailable) as exc:
            nowhere.get_item("sku-1")
        assert nowhere.health() is False
    assert not isinstance(exc.value, WorldTimeout)
