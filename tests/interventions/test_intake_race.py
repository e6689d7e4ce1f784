"""A hold of intake racing claims on PostgreSQL (real threads, real connections): no claim starts
after the hold commits, and a claim already holding its run's lock commits before the hold does."""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection, transaction

from core.actors import Actor
from core.auth import actor_for_user
from core.errors import DomainError
from interventions.intake import hold_intake
from runs.models import Run
from runs.services.decisions import lock_run
from runs.services.lifecycle import claim_run, create_run

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = Actor(kind="worker", name="w", role="worker")


def _queued(n):
    return [
        str(create_run(actor=WORKER, agent="purchasing", goal=f"g{i}", authority=[]).pk)
        for i in range(n)
    ]


def test_no_claim_starts_after_the_hold_commits(agent, cast, postgres_only):
    ian = actor_for_user(cast["ian"][0])
    ids = _queued(60)
    attempts: list[tuple[float, float, str, str]] = []  # start, end, run, outcome
    hold_times: dict[str, float] = {}
    lock = threading.Lock()
    # Set when the race starts. On a loaded machine the hold may take longer than the 4 s window:
    # the claimers go on until 0.5 s after it commits (the race needs claims after it), never past
    # the hard stop.
    stop = hard_stop = 0.0
    go = threading.Event()

    def claimer(seed):
        rng = random.Random(seed)
        try:
            while (
                (time.monotonic() < stop or "hold" not in hold_times)
                and time.monotonic() < hard_stop
                and len(attempts) < 6000
            ):
                run_id = rng.choice(ids)
                start = time.monotonic()
                try:
                    claim_run(actor=WORKER, run_id=run_id, worker=f"w{seed}")
                    outcome = "claimed"
                except DomainError as err:
                    outcome = err.code + ("/held" if "intake_hold" in err.extra else "")
                with lock:
                    attempts.append((start, time.monotonic(), run_id, outcome))
                if "hold" in hold_times and time.monotonic() > hold_times["end"] + 0.5:
                    return
        finally:
            connection.close()

    holder_ready = threading.Event()

    def holder():
        try:
            # Its connection taken before the claimers start: under load, a fifth connection from
            # the pool while four claimers hammer it once took longer than the whole race.
            connection.ensure_connection()
            holder_ready.set()
            go.wait(30)
            time.sleep(0.3)
            hold_times["start"] = time.monotonic()
            hold_intake(actor=ian, scope="agent", target="purchasing", reason="incident")
            hold_times["end"] = time.monotonic()
            hold_times["hold"] = 1
        finally:
            connection.close()

    hold_thread = threading.Thread(target=holder)
    hold_thread.start()
    assert holder_ready.wait(30), "the holder got no connection"
    stop = time.monotonic() + 4.0
    hard_stop = time.monotonic() + 25.0
    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    go.set()
    threads.append(hold_thread)
    for t in threads:
        t.join(30)
    assert "hold" in hold_times, "the hold did not commit"
    end = hold_times["end"]
    after = [a for a in attempts if a[0] > end]
    assert after, "no claim was attempted after the hold: the race was not exercised"
    assert all(a[3] != "claimed" for a in after), [a for a in after if a[3] == "claimed"]
    assert any(a[3] == "not_claimable/held" for a in after)
    claimed = {a[2] for a in attempts if a[3] == "claimed"}
    assert claimed, "no claim before the hold: the race was not exercised"
    states = dict(Run.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert {str(pk) for pk, s in states.items() if s == "running"} == claimed
    assert all(s == "queued" for pk, s in states.items() if str(pk) not in claimed)


def test_a_claim_holding_its_run_lock_commits_before_the_hold(agent, cast, postgres_only):
    """The hold waits for a claim that already locked its run (the claim's lock_run to COMMIT)."""
    ian = actor_for_user(cast["ian"][0])
    (run_id,) = _queued(1)
    locked, release = threading.Event(), threading.Event()
    seen: dict[str, float] = {}

    def in_flight_claim():
        try:
            with transaction.atomic():
                lock_run(run_id)  # what claim_run holds from its first statement to COMMIT
                locked.set()
                release.wait(10)
                seen["claim_commit"] = time.monotonic()
        finally:
            connection.close()

    def holder():
        try:
            locked.wait(10)
            hold_intake(actor=ian, scope="all", target="", reason="incident")
            seen["hold_commit"] = time.monotonic()
        finally:
            connection.close()

    a, b = threading.Thread(target=in_flight_claim), threading.Thread(target=holder)
    a.start()
    b.start()
    locked.wait(10)
    time.sleep(0.5)
    assert "hold_commit" not in seen, "the hold committed while a claim held its run's lock"
    release.set()
    a.join(15)
    b.join(15)
    assert seen["hold_commit"] > seen["claim_commit"]


def test_three_holds_of_one_scope_at_once_one_holds_and_two_releases_at_once_one_releases(
    agent, cast, postgres_only
):
    """Incident commanders pressing Hold (then Release) at the same moment: exactly one decision
    each time; the others are refused 409 naming the hold, and audited as refused."""
    from audit.models import AuditEvent
    from interventions.intake import release_intake
    from runs.models import IntakeHold
    from tests.interventions.test_races import _run_in_threads

    _queued(3)
    people = [actor_for_user(cast[n][0]) for n in ("ian", "ada", "ian")]
    held = _run_in_threads(
        [
            lambda a=a: hold_intake(actor=a, scope="agent", target="purchasing", reason="incident")
            for a in people
        ]
    )
    assert sorted(r[0] for r in held) == ["conflict", "conflict", "ok"], held
    assert all("already held" in r[1]["detail"] for r in held if r[0] == "conflict"), held
    (hold,) = IntakeHold.objects.filter(released_at__isnull=True)
    assert IntakeHold.objects.count() == 1
    audit = AuditEvent.objects.filter(action="intervention.hold_intake")
    assert sorted(audit.values_list("outcome", flat=True)) == ["allowed", "denied", "denied"]

    released = _run_in_threads(
        [
            lambda a=a: release_intake(actor=a, hold_id=hold.pk, reason="stable again")
            for a in people[:2]
        ]
    )
    assert sorted(r[0] for r in released) == ["conflict", "ok"], released
    refused = next(r[1] for r in released if r[0] == "conflict")
    assert "released already" in refused["detail"], refused
    hold.refresh_from_db()
    assert hold.released_at is not None and "release" in hold.receipt
    audit = AuditEvent.objects.filter(action="intervention.release_intake")
    assert sorted(audit.values_list("outcome", flat=True)) == ["allowed", "denied"]
    assert Run.objects.filter(state="queued").count() == 3  # claimable again, none started
