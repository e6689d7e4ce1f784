"""The audit chain (docs/concepts/audit.md): written with the change, append-only in the database, verified link by
link, exported as JSON Lines. Tampering is done the way an attacker with database access would: with
the append-only trigger switched off for the session."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace

import pytest
from django.core.management import ManagementUtility, call_command
from django.db import DatabaseError, connection, transaction

from audit.chain.append import appending
from audit.chain.hashing import GENESIS, link_hash
from audit.models import SYSTEM, AuditChain, AuditEvent
from audit.services import record_audit, verify_chain
from core.actors import system_actor
from runs.models import Attempt, Checkpoint, ExecutionLease, HistoryEvent, Run
from runs.selectors import verify_history
from runs.services import decisions, lifecycle
from tests.conftest import claim, declare, start_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only")]

ACTOR = system_actor("test")


def _write(n: int) -> list[AuditEvent]:
    return [
        record_audit(
            actor=ACTOR,
            action="test.event",
            object_type="run",
            object_id=f"obj-{i}",
            reason=f"reason {i}",
            context={"i": i},
        )
        for i in range(1, n + 1)
    ]


@contextmanager
def tampering():
    """Switch the append-only trigger off for this session, as someone with database access could."""
    with connection.cursor() as cur:
        cur.execute("SET session_replication_role = replica")
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute("SET session_replication_role = DEFAULT")


def _at(seq: int):
    """The system chain's row at position ``seq`` (the chain ``_write`` appends to)."""
    return AuditEvent.objects.filter(chain=SYSTEM, chain_seq=seq)


def _row(seq: int) -> AuditEvent:
    return _at(seq).get()


def _forge(seq: int, prev_hash: str, **fields) -> AuditEvent:
    """A well-formed row an attacker builds: the chain's hash is not keyed, so anyone can compute it."""
    event = AuditEvent(
        seq=10**12 + seq,  # any free reading-order number: it is not evidence
        chain=SYSTEM,
        chain_seq=seq,
        actor_kind="user",
        actor="mallory",
        action="test.forged",
        object_type="run",
        object_id="forged",
        outcome="allowed",
        component="psql",
        prev_hash=prev_hash,
        **fields,
    )
    event.hash = link_hash(prev_hash, event.hashed_fields())
    event.save(force_insert=True)
    return event


def _renumber(from_seq: int, by: int) -> None:
    rows = AuditEvent.objects.filter(chain=SYSTEM, chain_seq__gte=from_seq).order_by(
        "-chain_seq" if by > 0 else "chain_seq"
    )
    for seq in list(rows.values_list("chain_seq", flat=True)):
        _at(seq).update(chain_seq=seq + by)


# --- written in the same transaction as the change ------------------------------------------------


def test_if_the_audit_write_fails_the_change_does_not_happen(worker):
    run = start_run(worker)
    history = HistoryEvent.objects.filter(run_id=run["id"]).count()
    audit_rows = AuditEvent.objects.count()
    # The database refuses the audit insert (a trigger added for this test, rolled back with it).
    with connection.cursor() as cur:
        cur.execute("""
            CREATE FUNCTION test_refuse_audit() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION 'audit store unavailable'; END; $$ LANGUAGE plpgsql;
            CREATE TRIGGER test_refuse_audit BEFORE INSERT ON audit_auditevent
              FOR EACH ROW EXECUTE FUNCTION test_refuse_audit();
        """)
    with pytest.raises(DatabaseError, match="audit store unavailable"):
        lifecycle.claim_run(actor=ACTOR, run_id=run["id"], worker="w-1")
    with connection.cursor() as cur:
        cur.execute(
            "DROP TRIGGER test_refuse_audit ON audit_auditevent; DROP FUNCTION test_refuse_audit();"
        )
    stored = Run.objects.get(pk=run["id"])
    assert stored.state == "queued" and stored.fencing_token == 0 and stored.attempt_count == 0
    assert not ExecutionLease.objects.filter(run_id=run["id"]).exists()
    assert not Attempt.objects.filter(run_id=run["id"]).exists()
    assert HistoryEvent.objects.filter(run_id=run["id"]).count() == history
    assert AuditEvent.objects.count() == audit_rows


def test_if_the_decision_fails_after_its_audit_write_neither_survives(worker, monkeypatch):
    run = start_run(worker)
    written = []

    def audit_then_remember(event):
        extra = appending(event)  # the claim's audit append, inside its one write statement

        def remember(found):
            extra.done(found)
            written.append(event.pk)

        return replace(extra, done=remember)

    def broken_step_after_the_write(*args, **kwargs):
        raise RuntimeError("crash after the audit row was written")

    monkeypatch.setattr(decisions, "appending", audit_then_remember)
    monkeypatch.setattr(lifecycle, "_supersede", broken_step_after_the_write)
    head_before = AuditChain.objects.get(key=f"run:{run['id']}").seq
    with pytest.raises(RuntimeError):
        lifecycle.claim_run(actor=ACTOR, run_id=run["id"], worker="w-1")
    assert written, "the audit row was written inside the transaction"
    assert not AuditEvent.objects.filter(pk__in=written).exists()
    assert AuditChain.objects.get(key=f"run:{run['id']}").seq == head_before
    assert Run.objects.get(pk=run["id"]).state == "queued"
    assert not ExecutionLease.objects.filter(run_id=run["id"]).exists()
    assert verify_chain().ok


# --- append-only, enforced by PostgreSQL ------------------------------------------------------------


@pytest.mark.parametrize("table", ["audit_auditevent", "runs_historyevent", "runs_checkpoint"])
@pytest.mark.parametrize(
    ("statement", "refusal"),
    [
        ("UPDATE {table} SET hash = 'x'", "Cannot update rows"),
        ("DELETE FROM {table}", "Cannot delete rows"),
        ("TRUNCATE {table} CASCADE", "Cannot truncate"),  # a statement: row triggers never see it
    ],
)
def test_update_delete_and_truncate_are_refused_by_the_database(worker, table, statement, refusal):
    model = {
        "audit_auditevent": AuditEvent,
        "runs_historyevent": HistoryEvent,
        "runs_checkpoint": Checkpoint,
    }[table]
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    resp = worker.post(
        f"/runs/{run['id']}/checkpoints", {"fencing_token": token, "step": "s", "state": {}}
    )
    assert resp.status_code == 201
    rows = model.objects.count()
    assert rows > 0
    with pytest.raises(DatabaseError, match=refusal), transaction.atomic():
        with connection.cursor() as cur:
            # Check the deferred foreign keys of this test's inserts now: PostgreSQL will not TRUNCATE
            # a table with pending trigger events, and that refusal is not the one under test.
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cur.execute(statement.format(table=table))
    assert model.objects.count() == rows
    assert verify_chain().ok


def test_orm_update_and_delete_of_audit_rows_are_refused(worker):
    start_run(worker)
    with pytest.raises(DatabaseError, match="Cannot update rows"), transaction.atomic():
        AuditEvent.objects.update(reason="nothing to see")
    with pytest.raises(DatabaseError, match="Cannot delete rows"), transaction.atomic():
        AuditEvent.objects.all().delete()
    with pytest.raises(DatabaseError, match="Cannot delete rows"), transaction.atomic():
        HistoryEvent.objects.all().delete()
    assert verify_chain().ok


# --- verification names the first broken link -------------------------------------------------------


def test_an_untouched_chain_verifies():
    _write(6)
    report = verify_chain()
    assert (
        report.ok
        and report.checked == 6
        and report.head_seq == 6
        and report.first_broken_seq is None
    )


def test_an_empty_chain_verifies():
    assert verify_chain().ok


def test_verify_names_an_edited_row():
    _write(6)
    with tampering():
        _at(3).update(reason="approved by the CFO")
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 3, "edited")


def test_verify_names_an_edited_row_even_when_its_hash_was_recomputed():
    _write(6)
    row = _row(3)
    row.reason = "approved by the CFO"
    with tampering():
        _at(3).update(reason=row.reason, hash=link_hash(row.prev_hash, row.hashed_fields()))
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 3, "edited")


def test_verify_names_the_last_row_edited_and_rehashed():
    _write(6)
    row = _row(6)
    row.reason = "nothing happened"
    with tampering():
        _at(6).update(reason=row.reason, hash=link_hash(row.prev_hash, row.hashed_fields()))
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 6, "edited")


def test_verify_names_a_deleted_row():
    _write(6)
    with tampering():
        _at(3).delete()
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 3, "deleted")


def test_verify_names_a_deleted_row_hidden_by_renumbering():
    _write(6)
    with tampering():
        _at(3).delete()
        _renumber(4, -1)
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 3, "deleted")


def test_verify_names_a_deleted_last_row():
    _write(6)
    with tampering():
        _at(6).delete()
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 6, "deleted")


def test_verify_names_an_inserted_row_linked_into_the_middle():
    _write(6)
    with tampering():
        _renumber(3, +1)
        _forge(3, _row(2).hash)
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 3, "inserted")


def test_verify_names_an_inserted_row_that_links_nowhere():
    _write(6)
    with tampering():
        _renumber(3, +1)
        _forge(3, "f" * 64)
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 3, "inserted")


def test_verify_names_a_row_appended_behind_the_chains_back():
    _write(6)
    with tampering():
        _forge(7, _row(6).hash)
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 7, "inserted")


def test_verify_names_reordered_rows():
    _write(6)
    with tampering():
        _at(3).update(chain_seq=-3)
        _at(4).update(chain_seq=3)
        _at(-3).update(chain_seq=4)
    report = verify_chain()
    assert (report.ok, report.first_broken_seq, report.problem) == (False, 3, "reordered")


def test_tampering_with_run_history_is_caught_by_its_own_chain(worker):
    run = start_run(worker)
    claim(worker, run["id"])
    declare(worker, run["id"], 1)
    with tampering():
        HistoryEvent.objects.filter(run_id=run["id"], seq=2).update(data={"worker": "someone else"})
    report = verify_history(Run.objects.get(pk=run["id"]))
    assert (report["ok"], report["first_broken_seq"], report["problem"]) == (False, 2, "edited")


# --- the management commands ------------------------------------------------------------------------


def _manage(*argv: str) -> int:
    """Run a command the way ``manage.py`` does, exit status included."""
    try:
        ManagementUtility(["manage.py", *argv]).execute()
    except SystemExit as exit_:
        return exit_.code or 0
    return 0


def test_audit_verify_exits_zero_on_a_good_chain(capsys):
    _write(4)
    assert _manage("audit_verify") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ok"] is True


def test_audit_verify_exits_non_zero_naming_the_seq_on_a_broken_chain(capsys):
    _write(6)
    with tampering():
        _at(4).update(actor="mallory")
    assert _manage("audit_verify") != 0
    err = capsys.readouterr().err
    assert "seq 4" in err and "edited" in err


def test_audit_export_writes_json_lines_with_hash_and_prev_hash(tmp_path, worker):
    run = start_run(worker)
    claim(worker, run["id"])
    path = tmp_path / "audit.jsonl"
    call_command("audit_export", "--output", str(path))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == AuditEvent.objects.count() >= 2
    orders = [r["order"] for r in rows]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    chain = [r for r in rows if r["chain"] == f"run:{run['id']}"]  # the run's chain, in order
    assert [r["seq"] for r in chain] == list(range(1, len(chain) + 1)) and len(chain) >= 2
    assert chain[0]["prev_hash"] == GENESIS
    for before, row in zip(chain, chain[1:], strict=False):
        assert row["prev_hash"] == before["hash"]
    for row in rows:  # each line carries everything needed to re-check its own link
        fields = {k: v for k, v in row.items() if k not in ("hash", "prev_hash", "order")}
        assert link_hash(row["prev_hash"], fields) == row["hash"]
    assert {
        "actor",
        "action",
        "object_type",
        "object_id",
        "outcome",
        "reason",
        "created_at",
        "context",
    } <= set(rows[0])


def test_audit_export_to_stdout_and_since_seq(capsys):
    written = _write(5)
    call_command("audit_export", "--since-seq", str(written[2].seq))
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [4, 5]  # their place in the system chain


# --- denied calls are audited with the reason --------------------------------------------------------


def test_denied_calls_are_audited_with_the_reason(worker, client):
    from runs.models import ApiToken
    from tests.conftest import Api

    run = start_run(worker)
    c = claim(worker, run["id"])
    worker.post(f"/runs/{run['id']}/claim", {"worker": "w-2"})  # lease held
    declare(worker, run["id"], 1, key="ship", tool="shipping", action="create_label")  # no grant
    worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 0})  # stale token
    worker.post(
        "/runs", {"agent": "purchasing", "goal": "g", "authority": [{"scope": "bank:wire"}]}
    )
    _, other_secret = ApiToken.issue(kind=ApiToken.WORKER, name="other", agents=["support"])
    from runs.models import Agent

    Agent.objects.create(name="support", allowed_scopes=[])
    Api(client, other_secret).post("/runs", {"agent": "purchasing", "goal": "g"})  # wrong agent
    denied = {
        (e.action, e.reason.split(":")[0]) for e in AuditEvent.objects.filter(outcome="denied")
    }
    assert ("run.claim", "lease_held") in denied
    assert ("effect.declare", "authority_missing") in denied
    assert ("lease.heartbeat", "lease_lost") in denied
    assert ("run.create", "authority_not_allowed") in denied
    assert ("run.create", "forbidden") in denied
    for event in AuditEvent.objects.filter(outcome="denied"):
        assert event.reason and event.actor and event.component
    assert verify_chain().ok
