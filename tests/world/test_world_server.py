"""The world's own contract: idempotency, by-key lookups, business rules, recording and counts."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from world.client import WorldClient, WorldError


def test_seed_items(world: WorldClient):
    assert world.get_item("sku-1") == {"sku": "sku-1", "price": 12.5, "stock": 100}
    assert [i["sku"] for i in world.list_items()] == ["sku-1", "sku-2", "sku-3", "sku-4", "sku-5"]
    with pytest.raises(WorldError) as exc:
        world.get_item("sku-404")
    assert (exc.value.status, exc.value.error) == (404, "unknown_sku")


def test_same_key_same_body_charges_once(world: WorldClient):
    first = world.charge(25.0, "order-1-charge", order="order-1")
    again = world.charge(25.0, "order-1-charge", order="order-1")
    assert first["replayed"] is False and again["replayed"] is True
    assert again["charge_id"] == first["charge_id"]
    counts = world.counts()["charges"]
    assert counts["total"] == 1 and counts["by_key"] == {"order-1-charge": 1}
    assert counts["amount_charged"] == 25.0


def test_replay_is_http_200_and_first_is_201(world_server, world: WorldClient):
    url = f"{world_server.url}/payments/charge"
    first = httpx.post(url, json={"amount": 5}, headers={"Idempotency-Key": "k"})
    second = httpx.post(url, json={"amount": 5}, headers={"Idempotency-Key": "k"})
    assert (first.status_code, second.status_code) == (201, 200)


def test_same_key_different_body_is_rejected(world: WorldClient):
    world.charge(25.0, "k1")
    with pytest.raises(WorldError) as exc:
        world.charge(26.0, "k1")
    assert (exc.value.status, exc.value.error) == (422, "idempotency_key_reused")
    # a different action under the same key in the same system is a different request too
    with pytest.raises(WorldError) as exc:
        world.refund("ch_x", "k1")
    assert exc.value.error == "idempotency_key_reused"
    assert world.counts()["charges"]["total"] == 1


def test_keys_are_scoped_per_system(world: WorldClient):
    world.charge(10, "shared-key")
    reservation = world.reserve("sku-1", 1, "shared-key")
    assert reservation["replayed"] is False


def test_key_is_required_and_body_key_accepted(world_server, world: WorldClient):
    url = f"{world_server.url}/payments/charge"
    missing = httpx.post(url, json={"amount": 5})
    assert missing.status_code == 400 and missing.json()["error"] == "idempotency_key_required"
    via_body = httpx.post(url, json={"amount": 5, "idempotency_key": "body-key"})
    assert via_body.status_code == 201
    # the body key is not part of the fingerprint: the header form of the same call replays
    assert world.charge(5, "body-key")["replayed"] is True
    clash = httpx.post(
        url, json={"amount": 5, "idempotency_key": "a"}, headers={"Idempotency-Key": "b"}
    )
    assert clash.status_code == 400


def test_concurrent_calls_with_one_key_commit_once(world: WorldClient):
    results, errors = [], []

    def call():
        try:
            with WorldClient(world.base_url, timeout=5) as c:
                results.append(c.charge(99.0, "racy-key"))
        except Exception as exc:  # pragma: no cover - shows up in the assertion
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({r["charge_id"] for r in results}) == 1
    assert sum(not r["replayed"] for r in results) == 1
    assert world.counts()["charges"]["by_key"] == {"racy-key": 1}


def test_by_key(world: WorldClient):
    assert world.by_key("payments", "never-used") == {
        "found": False,
        "committed": False,
        "system": "payments",
        "key": "never-used",
    }
    charge = world.charge(10, "bk-1")
    found = world.by_key("payments", "bk-1")
    assert (
        found["committed"] is True and found["action"] == "charge" and found["status_code"] == 201
    )
    assert found["result"]["charge_id"] == charge["charge_id"]
    # a stored business refusal is known but not committed -> reconciliation says "failed"
    with pytest.raises(WorldError) as exc:
        world.charge(10_000, "bk-2")
    assert (exc.value.status, exc.value.error) == (402, "amount_over_limit")
    refused = world.by_key("payments", "bk-2")
    assert (
        refused["found"] is True and refused["committed"] is False and refused["status_code"] == 402
    )
    # keys with awkward characters survive the URL
    world.reserve("sku-2", 1, "order/7 reserve?x")
    assert world.by_key("inventory", "order/7 reserve?x")["committed"] is True


def test_business_refusals_replay(world: WorldClient):
    with pytest.raises(WorldError) as exc:
        world.charge(10, "declined", card="4000000000000002")
    assert (exc.value.status, exc.value.error) == (402, "card_declined")
    with pytest.raises(WorldError) as again:
        world.charge(10, "declined", card="4000000000000002")
    assert again.value.body["replayed"] is True and again.value.status == 402
    assert world.counts()["charges"]["total"] == 0


def test_inventory_reserve_and_release(world: WorldClient):
    res = world.reserve("sku-3", 2, "r1", order="o1")
    assert world.get_item("sku-3")["stock"] == 3
    with pytest.raises(WorldError) as exc:
        world.reserve("sku-3", 4, "r2")
    assert (exc.value.status, exc.value.error) == (409, "insufficient_stock")
    rel = world.release(res["reservation_id"], "r1-release")
    assert rel["status"] == "released" and rel["already_released"] is False
    assert world.get_item("sku-3")["stock"] == 5
    assert world.release(res["reservation_id"], "r1-release")["replayed"] is True
    # a second release under another key gives nothing back twice
    other = world.release(res["reservation_id"], "r1-release-2")
    assert other["already_released"] is True and world.get_item("sku-3")["stock"] == 5
    with pytest.raises(WorldError) as exc:
        world.release("res_unknown", "r-x")
    assert (exc.value.status, exc.value.error) == (404, "unknown_reservation")


def test_shipping_and_payments_undo(world: WorldClient):
    label = world.create_label("o1", {"city": "Lyon"}, "l1")
    assert label["status"] == "active" and label["label_id"].startswith("lbl_")
    assert world.void_label(label["label_id"], "l1-void")["status"] == "voided"
    charge = world.charge(40, "c1")
    refund = world.refund(charge["charge_id"], "c1-refund")
    assert (
        refund["status"] == "refunded"
        and refund["amount"] == 40
        and refund["id"] == refund["refund_id"]
    )
    assert world.refund(charge["charge_id"], "c1-refund-2")["already_refunded"] is True
    counts = world.counts()
    assert counts["charges"]["refunded"] == 1 and counts["charges"]["amount_refunded"] == 40
    assert counts["charges"]["undo_by_key"] == {"c1-refund": 1}
    assert counts["labels"]["voided"] == 1


def test_price_and_stock_changes(world: WorldClient):
    assert world.set_price("sku-1", 15.0)["price"] == 15.0
    assert world.set_stock("sku-1", 3)["stock"] == 3
    assert world.get_item("sku-1") == {"sku": "sku-1", "price": 15.0, "stock": 3}
    with pytest.raises(WorldError):
        world.set_price("sku-404", 1.0)
    assert world.put_item("sku-9", price=1.5, stock=2) == {"sku": "sku-9", "price": 1.5, "stock": 2}
    world.reset()
    assert world.get_item("sku-1")["price"] == 12.5
    with pytest.raises(WorldError):
        world.get_item("sku-9")


def test_notification_cancel_while_queued(world: WorldClient, send_delay):
    n = world.enqueue_notification("a@example.com", "hello", "n1")
    assert n["status"] == "queued"
    cancelled = world.cancel_notification(n["notification_id"], "n1-cancel")
    assert cancelled["status"] == "cancelled"
    time.sleep(send_delay + 0.1)
    assert world.get_notification(n["notification_id"])["status"] == "cancelled"


def test_notification_is_irreversible_once_sent(world: WorldClient, send_delay):
    n = world.enqueue_notification("a@example.com", "hello", "n2")
    time.sleep(send_delay + 0.1)
    assert world.get_notification(n["notification_id"])["status"] == "sent"
    with pytest.raises(WorldError) as exc:
        world.cancel_notification(n["notification_id"], "n2-cancel")
    assert (exc.value.status, exc.value.error) == (409, "already_sent")
    assert world.counts()["notifications"]["sent"] == 1


def test_requests_are_recorded(world: WorldClient):
    world.charge(10, "rec-1")
    world.charge(10, "rec-1")
    with pytest.raises(WorldError):
        world.charge(11, "rec-1")
    world.get_item("sku-1")
    recorded = world.requests(system="payments", action="charge")
    assert [(r["status"], r["committed"], r["replayed"]) for r in recorded] == [
        (201, True, False),
        (200, False, True),
        (422, False, False),
    ]
    assert all(r["idempotency_key"] == "rec-1" for r in recorded)
    assert recorded[0]["body"] == {"amount": 10} and recorded[0]["at"] > 0
    by_action = world.counts()["requests"]["by_action"]
    assert by_action["payments:charge"] == {"total": 3, "committed": 1, "replayed": 1}
    assert by_action["inventory:get_item"]["total"] == 1
