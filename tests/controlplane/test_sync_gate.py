"""controlplane/gate.py: the sync-view gate admits in arrival order, and while the database is known
down (core/pg/reach.py) refuses a request that would have to wait, and the waiting ones the moment
a refusal is noted, from whichever thread notes it. The same gate on real processes and a frozen
database link: tests/deploy/test_database_unavailable.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from controlplane.gate import DatabaseDown, SyncGate
from core.pg import reach


@pytest.fixture(autouse=True)
def memory():
    reach.note_reached()
    yield
    reach.note_reached()


def test_slots_are_given_in_arrival_order_and_a_free_one_is_taken_at_once():
    async def scenario():
        gate, order = SyncGate(1, asyncio.get_running_loop()), []
        await gate.enter()

        async def request(n: int) -> None:
            await gate.enter()
            order.append(n)
            gate.leave()

        waiting = [asyncio.create_task(request(n)) for n in range(4)]
        await asyncio.sleep(0.05)
        assert order == []  # the one slot is held
        gate.leave()
        await asyncio.gather(*waiting)
        return order, gate._free

    assert asyncio.run(scenario()) == ([0, 1, 2, 3], 1)


def test_a_refusal_noted_on_another_thread_refuses_the_waiting_at_once_and_later_ones_too():
    async def scenario():
        gate = SyncGate(2, asyncio.get_running_loop())
        await gate.enter()
        await gate.enter()
        waiting = [asyncio.create_task(gate.enter()) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        noted = threading.Thread(target=reach.note_refused, args=("connection timeout expired",))
        noted.start()
        noted.join()
        got = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 1)
        with pytest.raises(DatabaseDown, match="connection timeout expired"):
            await gate.enter()  # would have to wait, while the refusal is fresh
        gate.leave()
        await asyncio.wait_for(gate.enter(), 1)  # a free slot is taken: the pool decides then
        reach.note_reached()
        late = asyncio.create_task(gate.enter())  # the database answered again: it waits
        await asyncio.sleep(0.05)
        assert not late.done()
        gate.leave()
        await asyncio.wait_for(late, 1)
        return got

    got = asyncio.run(scenario())
    assert [type(g) for g in got] == [DatabaseDown] * 3


def test_a_cancelled_waiter_handed_a_slot_passes_it_on():
    async def scenario():
        gate = SyncGate(1, asyncio.get_running_loop())
        await gate.enter()
        first = asyncio.create_task(gate.enter())
        second = asyncio.create_task(gate.enter())
        await asyncio.sleep(0.05)
        gate.leave()  # handed to the first ...
        first.cancel()  # ... which is cancelled before it runs
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(second, 1)  # the slot went on to the second
        gate.leave()
        return gate._free

    assert asyncio.run(scenario()) == 1
