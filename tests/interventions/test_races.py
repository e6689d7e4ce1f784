"""Real races on PostgreSQL: interventions against each other and against effect declarations."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from audit.models import AuditEvent
from audit.services import verify_chain
from core.actors import Actor
from core.auth import actor_for_user
from core.errors import DomainError
from interventions.base import issue
from interventions.plugins import Request
from runs.models import Effect, Run
from runs.services.effects import declare_effect
from runs.services.lifecycle import claim_run, create_run, finish_attempt

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = Actor(kind="worker", name="w", role="worker")


def _run_in_threads(jobs):
    barrier = threading.Barrier(len(jobs))
    results = [None] * len(jobs)

    def go(i, job):
        try:
            barrier.wait()
            results[i] = ("ok", job())
        except DomainError as err:
            results[i] = (err.code, err.payload())
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _running_run(agent):
    run = create_run(
        actor=WORKER,
        agent="purchasing",
        goal="g",
        authority=[{"scope": "payments:charge"}, {"scope": "inventory:*"}],
    )
    claim = claim_run(actor=WORKER, run_id=run.pk, worker="w")
    return run, claim


def test_two_operators_pausing_at_once_exactly_one_applies(agent, cast, postgres_only):
    run, _ = _running_run(agent)
    otto, olga = (actor_for_user(cast[n][0]) for n in ("otto", "olga"))
    results = _run_in_threads(
        [
            lambda a=a: issue(actor=a, run_id=run.pk, req=Request("pause", f"{a.name} saw smoke"))
            for a in (otto, olga)
        ]
    )
    codes = sorted(r[0] for r in results)
    assert codes == ["conflict", "ok"]
    loser = next(r for r in results if r[0] == "conflict")[1]
    assert loser["state"] in ("paused", "pausing")
    assert AuditEvent.objects.filter(action="intervention.pause", outcome="allowed").count() == 1
    assert AuditEvent.objects.filter(action="intervention.pause", outcome="denied").count() == 1


def test_retry_racing_close_on_a_failed_run_exactly_one_applies(agent, cast, postgres_only):
    run, claim = _running_run(agent)
    finish_attempt(
        actor=WORKER,
        run_id=run.pk,
        fencing_token=claim.lease.fencing_token,
        outcome="failed",
        failure_class="timeout",
    )
    otto, olga = (actor_for_user(cast[n][0]) for n in ("otto", "olga"))
    results = _run_in_threads(
        [
            lambda: issue(actor=otto, run_id=run.pk, req=Request("retry", "transient")),
            lambda: issue(actor=olga, run_id=run.pk, req=Request("close", "give up")),
        ]
    )
    assert sorted(r[0] for r in results) == ["conflict", "ok"]
    assert Run.objects.get(pk=run.pk).state in ("queued", "closed")
    assert (
        AuditEvent.objects.filter(
            action__in=["intervention.retry", "intervention.close"], outcome="denied"
        ).count()
        == 1
    )
    assert verify_chain().ok


def test_pause_racing_twenty_declarations_denies_every_one_committed_after_it(
    agent, cast, postgres_only
):
    run, claim = _running_run(agent)
    token = claim.lease.fencing_token
    otto = actor_for_user(cast["otto"][0])
    jobs = [
        lambda i=i: declare_effect(
            actor=WORKER,
            run_id=run.pk,
            fencing_token=token,
            step="charge",
            tool="payments",
            action="charge",
            idempotency_key=f"k-{i}",
            args={"i": i},
        )
        for i in range(20)
    ]
    jobs.insert(
        10, lambda: issue(actor=otto, run_id=run.pk, req=Request("pause", "stop the spend"))
    )
    results = _run_in_threads(jobs)
    assert all(r[0] == "ok" for r in results)
    # Audit rows are appended under the chain lock, held to commit: seq order is commit order.
    pause_seq = AuditEvent.objects.get(action="intervention.pause").seq
    declares = AuditEvent.objects.filter(action="effect.declare")
    assert declares.count() == 20  # none lost
    for event in declares:
        effect = Effect.objects.get(pk=event.object_id)
        if event.seq > pause_seq:
            assert effect.decision == "denied" and effect.denial_reason == "run_paused", event.seq
        else:
            assert effect.decision == "authorized", event.seq
    assert verify_chain().ok
