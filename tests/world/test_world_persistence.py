"""The world is its own process with its own file: a restart forgets nothing."""

from __future__ import annotations

from world.client import WorldClient


def test_state_survives_restart(tmp_path, world_process):
    db = tmp_path / "world.sqlite3"
    first = world_process(db, tmp_path / "1.log")
    try:
        with WorldClient(first.url, timeout=3) as client:
            charge = client.charge(12, "persist-1")
            client.set_price("sku-2", 31.0)
            client.set_fault("shipping", "down")
    finally:
        first.stop()
    second = world_process(db, tmp_path / "2.log")
    try:
        with WorldClient(second.url, timeout=3) as client:
            assert client.charge(12, "persist-1") == {**charge, "replayed": True}
            assert client.by_key("payments", "persist-1")["committed"] is True
            assert client.get_item("sku-2")["price"] == 31.0
            assert [f["kind"] for f in client.faults()] == ["down"]  # faults are state too
            assert client.counts()["charges"]["total"] == 1
    finally:
        second.stop()
