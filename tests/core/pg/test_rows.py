"""core.pg.rows: the hot path's hand-written equality lookups answer exactly what the ORM answers,
and ``lock=True`` really takes the row lock (PostgreSQL)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from core.pg import rows
from runs.models import Approval, AuthorityGrant, Effect, ExecutionLease, Run
from tests.conftest import claim, declare, start_run


@pytest.fixture
def run_with_rows(worker):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    for key in ("k-1", "k-2"):
        assert declare(worker, run["id"], token, key=key).status_code == 201
    assert (
        declare(worker, run["id"], token, key="k-3", tool="shipping", action="ship").status_code
        == 409
    )  # no grant
    return Run.objects.get(pk=run["id"])


def _pks(objs):
    return [o.pk for o in objs]


def test_equality_lookups_match_the_orm(run_with_rows):
    run = run_with_rows
    grants = sorted(_pks(rows.select_rows(AuthorityGrant, run=run.pk)), key=str)
    assert grants and grants == sorted(_pks(AuthorityGrant.objects.filter(run=run)), key=str)
    for key in ("k-1", "k-2", "k-3", "nope"):
        for decision in (Effect.AUTHORIZED, Effect.DENIED):
            expected = Effect.objects.filter(
                run=run, idempotency_key=key, decision=decision
            ).first()
            got = rows.select_row(Effect, run=run, idempotency_key=key, decision=decision)
            assert (got and got.pk) == (expected and expected.pk), (key, decision)
    effect = Effect.objects.filter(run=run, idempotency_key="k-1").get()
    loaded = rows.select_row(Effect, pk=effect.pk)
    assert loaded.run.pk == run.pk  # relations load lazily, as on any instance
    # Every column converted exactly as the ORM converts it (JSON, UUIDs, datetimes, booleans, nulls).
    for model, obj in (
        (Effect, effect),
        (Run, run),
        (ExecutionLease, ExecutionLease.objects.get(run=run)),
        *((AuthorityGrant, g) for g in AuthorityGrant.objects.filter(run=run)),
    ):
        mine = rows.select_row(model, pk=obj.pk)
        fresh = model.objects.get(pk=obj.pk)
        for field in model._meta.concrete_fields:
            assert getattr(mine, field.attname) == getattr(fresh, field.attname), (
                model.__name__,
                field.name,
            )
            assert type(getattr(mine, field.attname)) is type(getattr(fresh, field.attname)), (
                model.__name__,
                field.name,
            )
        assert mine._state.adding is False and mine._state.db == "default"


def test_order_by_and_limit(run_with_rows):
    run = run_with_rows
    now = timezone.now()
    for minutes in (3, 1, 2):
        Approval.objects.create(
            run=run,
            attempt_id=run.current_attempt_id,
            requested_by="worker-1",
            tool="payments",
            action="charge",
            args={},
            digest=f"d{minutes}",
            requested_at=now - timedelta(minutes=minutes),
            status=Approval.PENDING,
            deadline=now + timedelta(hours=1),
        )
    expected = Approval.objects.filter(run=run, tool="payments", action="charge").order_by(
        "-requested_at"
    )
    assert (
        rows.select_row(
            Approval, run=run.pk, tool="payments", action="charge", order_by=("-requested_at",)
        ).pk
        == expected.first().pk
    )
    assert _pks(
        rows.select_rows(
            Approval, run=run.pk, tool="payments", action="charge", order_by=("requested_at",)
        )
    ) == _pks(expected.reverse())


def test_values_a_column_cannot_hold_match_nothing(db):
    assert rows.select_rows(Run, pk="not-a-uuid") == []
    assert rows.select_row(Run, pk=uuid.uuid4()) is None


@pytest.mark.django_db(transaction=True)
def test_lock_takes_the_row_lock(postgres_only, worker):
    run = start_run(worker)
    locked, release = threading.Event(), threading.Event()

    def holder():
        try:
            with transaction.atomic():
                assert rows.select_row(Run, pk=run["id"], lock=True) is not None
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert locked.wait(10)
        with pytest.raises(DatabaseError):  # "could not obtain lock": the row is held FOR UPDATE
            with transaction.atomic():
                Run.objects.select_for_update(nowait=True).get(pk=run["id"])
        # Without lock=True the same lookup does not wait for the holder.
        assert rows.select_row(Run, pk=run["id"]) is not None
    finally:
        release.set()
        thread.join(10)


@pytest.mark.django_db(transaction=True)
def test_the_run_lock_does_not_block_a_foreign_key_check_on_the_run(postgres_only, worker):
    """lock=True is FOR NO KEY UPDATE: a second decision on the row still waits, but a transaction that
    commits a row referencing it (a child run: its deferred foreign-key check takes KEY SHARE on the
    parent) does not. With FOR UPDATE, a tree cancel holding a parent deadlocked with a child's commit."""
    parent = start_run(worker)
    locked, release = threading.Event(), threading.Event()

    def holder():
        try:
            with transaction.atomic():
                assert rows.select_row(Run, pk=parent["id"], lock=True) is not None
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert locked.wait(10)
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = '2s'")
        try:
            # A key-share lock, as the foreign-key check of a child's INSERT takes: not blocked.
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute(
                        "SELECT 1 FROM runs_run WHERE id = %s FOR KEY SHARE", [parent["id"]]
                    )
            # ...while a second decision on the same run still has to wait for the holder.
            with pytest.raises(DatabaseError):
                with transaction.atomic():
                    Run.objects.select_for_update(no_key=True, nowait=True).get(pk=parent["id"])
        finally:
            with connection.cursor() as cur:
                cur.execute("SET lock_timeout = 0")
    finally:
        release.set()
        thread.join(10)


def test_extras_join_the_one_write_statement_and_each_gets_its_own_values(postgres_only, worker):
    run = Run.objects.get(pk=start_run(worker)["id"])
    got: dict = {}

    def parts(prefix):
        cte = [f"{prefix} AS (SELECT %s::int AS n)"]
        return cte, [41], [f"(SELECT n + 1 FROM {prefix})", "%s::text"], ["x"]

    first = rows.Extra(parts=parts, done=lambda found: got.update(first=found), fallback=None)
    second = rows.Extra(
        parts=lambda prefix: ([], [], ["%s::int"], [7]),
        done=lambda found: got.update(second=found),
        fallback=None,
    )
    with transaction.atomic():
        rows.write_rows([], [(Run, run.pk, {"goal": "changed"})], [first, second])
    assert got == {"first": [42, "x"], "second": [7]}
    assert Run.objects.get(pk=run.pk).goal == "changed"


def test_extras_alone_run_their_fallback(db):
    ran = []
    extra = rows.Extra(parts=None, done=None, fallback=lambda: ran.append("fallback"))
    rows.write_rows([], [], [extra])
    assert ran == ["fallback"]


@pytest.mark.django_db
def test_a_statement_over_50_parameters_is_converted_once_per_text(postgres_only, monkeypatch):
    """psycopg re-scans the placeholders of a statement with more than 50 parameters on every
    execute; the hot-path cursor converts each statement text once, and the answer is the same."""
    import psycopg._queries

    scans: list[int] = []
    real = psycopg._queries._query2pg_nocache

    def counted(query, encoding):
        scans.append(1)
        return real(query, encoding)

    monkeypatch.setattr(psycopg._queries, "_query2pg_nocache", counted)
    rows._query_class.cache_clear()
    rows._prepared_cursor_class.cache_clear()
    rows._converted.clear()
    values = list(range(60))
    sql = "SELECT " + " + ".join(["%s::int"] * len(values)) + f" AS total_{uuid.uuid4().hex}"
    try:
        for shift in range(3):
            with rows.hot_cursor(connection) as cursor:
                cursor.execute(sql, [v + shift for v in values])
                assert cursor.fetchone()[0] == sum(values) + 60 * shift
        assert len(scans) == 1  # psycopg alone: 3
    finally:
        rows._query_class.cache_clear()
        rows._prepared_cursor_class.cache_clear()
        rows._converted.clear()
