"""Real races on PostgreSQL: many threads, each with its own connection, released together by a barrier.

Each compare-and-swap in the protocol (claim, declare, the audit chain head) gets one test here. The
threads call the services directly, the way the API edge does; each closes its connection at the end
so the pool gets it back and the test database can be flushed.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from audit.models import AuditEvent
from audit.services import record_audit, verify_chain
from core.actors import Actor, system_actor
from core.errors import DomainError
from runs.models import Agent, Attempt, Effect, ExecutionLease, Run
from runs.selectors import verify_history
from runs.services import effects, lifecycle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres_only")]

WORKER = Actor(kind="worker", name="race-worker", role="worker", component="test")


def run_together(n: int, work: Callable[[int], Any]) -> list[tuple[str, Any]]:
    """Start ``n`` threads at the same instant; return ("ok", value) or ("err", exception) per thread."""
    barrier = threading.Barrier(n)
    results: list[tuple[str, Any] | None] = [None] * n

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = ("ok", work(i))
        except BaseException as exc:
            results[i] = ("err", exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,), name=f"racer-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racer hung"
    return results  # type: ignore[return-value]


def _queued_run() -> Run:
    Agent.objects.get_or_create(
        name="purchasing", defaults={"allowed_scopes": ["payments:charge", "inventory:*"]}
    )
    return lifecycle.create_run(
        actor=WORKER,
        agent="purchasing",
        goal="race",
        authority=[{"scope": "payments:charge", "ttl_s": 3600}],
    )


def _codes(results) -> Counter:
    return Counter(
        value.code
        if kind == "err" and isinstance(value, DomainError)
        else (kind if kind == "ok" else f"unexpected:{value!r}")
        for kind, value in results
    )


def test_fifty_concurrent_claimers_get_exactly_one_lease():
    run = _queued_run()
    results = run_together(
        50, lambda i: lifecycle.claim_run(actor=WORKER, run_id=run.pk, worker=f"w-{i}")
    )
    codes = _codes(results)
    assert codes["ok"] == 1, codes
    assert codes["lease_held"] + codes["not_claimable"] == 49, codes
    run.refresh_from_db()
    assert run.state == "running" and run.fencing_token == 1 and run.attempt_count == 1
    assert ExecutionLease.objects.filter(run=run).count() == 1
    assert ExecutionLease.objects.filter(run=run, status="active").count() == 1
    assert Attempt.objects.filter(run=run).count() == 1
    winner = next(v for k, v in results if k == "ok")
    assert winner.lease.fencing_token == 1 and run.current_attempt_id == winner.attempt.pk
    # every loser was audited as denied; the winner's transition once
    assert (
        AuditEvent.objects.filter(run_id=run.pk, action="run.claim", outcome="denied").count() == 49
    )
    assert (
        AuditEvent.objects.filter(run_id=run.pk, action="run.claim", outcome="allowed").count() == 1
    )
    assert verify_history(run)["ok"] and verify_chain().ok


def test_fifty_concurrent_declarations_of_one_key_make_exactly_one_effect():
    run = _queued_run()
    token = lifecycle.claim_run(actor=WORKER, run_id=run.pk, worker="w-1").lease.fencing_token

    def declare(i: int):
        return effects.declare_effect(
            actor=WORKER,
            run_id=run.pk,
            fencing_token=token,
            step="charge",
            tool="payments",
            action="charge",
            idempotency_key="order-42-charge",
            args={"amount": 100, "currency": "EUR"},
        )

    results = run_together(50, declare)
    oks = [v for k, v in results if k == "ok"]
    codes = _codes(results)
    assert [d.decision for d in oks] == ["authorized"], codes
    # the other 49 were told not to dispatch: the first is still in flight
    assert codes["effect_unresolved"] == 49, codes
    assert (
        Effect.objects.filter(
            run=run, idempotency_key="order-42-charge", decision="authorized"
        ).count()
        == 1
    )
    assert not Effect.objects.filter(run=run, decision="denied").exists()
    run.refresh_from_db()
    assert verify_history(run)["ok"] and verify_chain().ok


def test_fifty_concurrent_declarations_after_the_outcome_all_replay_the_same_effect():
    run = _queued_run()
    token = lifecycle.claim_run(actor=WORKER, run_id=run.pk, worker="w-1").lease.fencing_token
    kwargs = dict(
        actor=WORKER,
        run_id=run.pk,
        fencing_token=token,
        step="charge",
        tool="payments",
        action="charge",
        idempotency_key="k",
        args={"amount": 1},
    )
    first = effects.declare_effect(**kwargs).effect
    effects.record_outcome(
        actor=WORKER,
        effect_id=first.pk,
        fencing_token=token,
        status="committed",
        external_ref="ch_1",
    )
    results = run_together(50, lambda i: effects.declare_effect(**kwargs))
    assert _codes(results) == Counter(ok=50)
    assert {(v.decision, v.effect.pk, v.effect.external_ref) for _, v in results} == {
        ("replayed", first.pk, "ch_1")
    }
    assert Effect.objects.filter(run=run).count() == 1


def test_sixteen_concurrent_audit_writers_never_fork_a_chain():
    """Half the writers append to the system chain, half to one run's chain, all at once: each chain
    comes out gap-free, every row linked to the one before, the run's chain created exactly once."""
    writers, per_writer = 16, 25
    shared_run = uuid.uuid4()

    def write(i: int) -> list[tuple[str, int]]:
        actor = system_actor(f"writer-{i}")
        written = []
        for j in range(per_writer):
            event = record_audit(
                actor=actor,
                action="test.write",
                object_type="run",
                object_id=f"{i}-{j}",
                run_id=shared_run if i % 2 else None,
                context={"writer": i, "n": j},
            )
            written.append((event.chain, event.chain_seq))
        return written

    results = run_together(writers, write)
    assert all(kind == "ok" for kind, _ in results), [v for k, v in results if k == "err"]
    total = writers * per_writer
    for chain in ("system", f"run:{shared_run}"):
        seqs = sorted(s for _, mine in results for c, s in mine if c == chain)
        assert seqs == list(range(1, total // 2 + 1))  # no gaps, no duplicates
        rows = list(
            AuditEvent.objects.filter(chain=chain)
            .order_by("chain_seq")
            .values_list("chain_seq", "prev_hash", "hash")
        )
        assert all(rows[i][1] == rows[i - 1][2] for i in range(1, len(rows)))  # each links back
        assert len({r[2] for r in rows}) == total // 2  # no two rows claim the same position
    report = verify_chain()
    assert report.ok and report.checked == total and report.head_seq == total
    assert report.chains == 2


def _declared(run: Run) -> tuple[int, Effect]:
    token = lifecycle.claim_run(actor=WORKER, run_id=run.pk, worker="w-1").lease.fencing_token
    effect = effects.declare_effect(
        actor=WORKER,
        run_id=run.pk,
        fencing_token=token,
        step="charge",
        tool="payments",
        action="charge",
        idempotency_key="k",
        args={"amount": 1},
    ).effect
    return token, effect


def test_twenty_concurrent_outcomes_carrying_checkpoints_record_one_outcome_and_number_every_checkpoint():
    """An SDK retry storm: the outcome is recorded once; each carried checkpoint takes the next seq
    under the run lock (no gap, no duplicate), and both chains stay whole."""
    from runs.models import Checkpoint, HistoryEvent

    run = _queued_run()
    token, effect = _declared(run)
    results = run_together(
        20,
        lambda i: effects.record_outcome_with(
            actor=WORKER,
            effect_id=effect.pk,
            fencing_token=token,
            status="committed",
            external_ref="ch_1",
            checkpoint={"step": "charge", "state": {"racer": i}},
        ),
    )
    assert _codes(results) == Counter(ok=20)
    assert all(v.checkpoint is not None for _, v in results)
    assert sorted(Checkpoint.objects.filter(run=run).values_list("seq", flat=True)) == list(
        range(1, 21)
    )
    assert HistoryEvent.objects.filter(run=run, kind="effect_outcome").count() == 1
    assert AuditEvent.objects.filter(action="effect.outcome", object_id=str(effect.pk)).count() == 1
    run.refresh_from_db()
    assert run.checkpoint_seq == 20 and verify_history(run)["ok"] and verify_chain().ok


def test_an_outcome_carrying_a_checkpoint_racing_the_finish_never_checkpoints_after_the_lease_ended():
    from runs.models import Checkpoint, HistoryEvent

    for _ in range(5):
        run = _queued_run()
        token, effect = _declared(run)

        def work(i: int, run=run, token=token, effect=effect):
            if i == 0:
                return effects.record_outcome_with(
                    actor=WORKER,
                    effect_id=effect.pk,
                    fencing_token=token,
                    status="committed",
                    checkpoint={"step": "charge", "state": {}},
                )
            return lifecycle.finish_attempt(
                actor=WORKER, run_id=run.pk, fencing_token=token, outcome="failed"
            )

        results = run_together(2, work)
        assert _codes(results) == Counter(ok=2)
        recorded = results[0][1]
        effect.refresh_from_db()
        assert effect.status == "committed"  # the outcome is a fact, recorded either way
        kinds = list(
            HistoryEvent.objects.filter(run=run).order_by("seq").values_list("kind", flat=True)
        )
        finished = max(i for i, k in enumerate(kinds) if k == "state_changed")
        if recorded.checkpoint is not None:  # the outcome won: its checkpoint precedes the finish
            assert kinds.index("checkpoint") < finished and not effect.late
        else:  # the finish won: the lease had ended, the checkpoint was refused
            assert recorded.checkpoint_refused.code == "lease_lost" and effect.late
            assert not Checkpoint.objects.filter(run=run).exists()
        run.refresh_from_db()
        assert verify_history(run)["ok"]
    assert verify_chain().ok


def test_an_open_decision_on_one_run_does_not_hold_up_audit_on_another():
    """No global serialisation point: a transaction that appended to run A's chain and has not
    committed yet blocks the next append to A's chain only; an append to run B's chain (and to the
    system chain) goes through at once."""
    run_a, run_b = uuid.uuid4(), uuid.uuid4()
    appended, release = threading.Event(), threading.Event()

    def hold_a() -> None:
        try:
            with transaction.atomic():
                record_audit(
                    actor=WORKER, action="test.hold", object_type="run", object_id="a", run_id=run_a
                )
                appended.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_a)
    holder.start()
    assert appended.wait(timeout=30)
    try:
        outcomes = run_together(3, lambda i: _append_with_lock_timeout([run_b, None, run_a][i]))
    finally:
        release.set()
        holder.join(timeout=30)
    (b_kind, _), (system_kind, _), (a_kind, a_error) = outcomes
    assert (b_kind, system_kind) == ("ok", "ok")
    assert a_kind == "err" and "lock timeout" in str(a_error)


def _append_with_lock_timeout(run_id):
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '500ms'")
        return record_audit(
            actor=WORKER, action="test.try", object_type="run", object_id="x", run_id=run_id
        ).chain
