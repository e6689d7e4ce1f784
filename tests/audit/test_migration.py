"""Migration 0004 splits the single global chain into per-chain audit without touching a written row:
the rows of before become the frozen ``legacy`` chain and verify as before, old (v1) anchors still hold
them, and new events go to their own chains after them."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from audit.anchors.signing import key_id, signed_bytes, signing_key
from audit.anchors.sink import DirectorySink
from audit.anchors.write import write_anchor
from audit.chain.hashing import GENESIS, link_hash
from audit.integrity import verify_all
from audit.models import LEGACY, SYSTEM, AuditChain, AuditEvent
from audit.services import record_audit, verify_chain
from core.actors import system_actor
from tests.audit.test_anchors import anchor_config  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only", "anchor_config"),
]

BEFORE = [("audit", "0003_audit_created_at_index")]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def _latest():
    return [
        key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == "audit"
    ]


def _write_old_chain(n: int) -> list[str]:
    """Rows exactly as the single-chain code wrote them: ``seq`` global and hashed, no chain name."""
    hashes, prev = [], GENESIS
    with connection.cursor() as cur:
        for seq in range(1, n + 1):
            fields = {
                "seq": seq,
                "event_id": str(uuid.uuid4()),
                "created_at": timezone.now(),
                "actor_kind": "system",
                "actor": "old",
                "role": "",
                "on_behalf_of": "",
                "action": "test.old",
                "object_type": "run",
                "object_id": str(seq),
                "run_id": None,
                "reason": f"before the split {seq}",
                "outcome": "allowed",
                "component": "test",
                "source_ip": "",
                "user_agent": "",
                "request_id": "",
                "context": {"n": seq},
            }
            value = link_hash(prev, fields)
            cur.execute(
                "INSERT INTO audit_auditevent (seq, event_id, created_at, actor_kind, actor, role,"
                " on_behalf_of, action, object_type, object_id, run_id, reason, outcome, component,"
                " source_ip, user_agent, request_id, context, prev_hash, hash) VALUES"
                " (%s, %s, %s, 'system', 'old', '', '', 'test.old', 'run', %s, NULL, %s, 'allowed',"
                " 'test', '', '', '', %s, %s, %s)",
                [
                    seq,
                    fields["event_id"],
                    fields["created_at"],
                    str(seq),
                    fields["reason"],
                    json.dumps({"n": seq}),
                    prev,
                    value,
                ],
            )
            hashes.append(value)
            prev = value
        cur.execute(
            "INSERT INTO audit_auditchainhead (id, seq, hash) VALUES (1, %s, %s)", [n, prev]
        )
    return hashes


def _v1_anchor(seq: int, value: str) -> None:
    key = signing_key()
    record = {
        "v": 1,
        "seq": seq,
        "hash": value,
        "at": timezone.now().isoformat(),
        "key": key_id(key.public_key()),
        "parts": {},
    }
    record["sig"] = base64.b64encode(key.sign(signed_bytes(record))).decode()
    DirectorySink().append(json.dumps(record))


def test_the_old_chain_becomes_the_legacy_chain_and_still_verifies_with_its_old_anchors():
    _migrate(BEFORE)
    hashes = _write_old_chain(5)
    _v1_anchor(3, hashes[2])
    _v1_anchor(5, hashes[4])
    _migrate(_latest())

    rows = list(AuditEvent.objects.order_by("seq").values_list("chain", "chain_seq", "seq", "hash"))
    assert rows == [(LEGACY, i, i, hashes[i - 1]) for i in range(1, 6)]  # not a byte changed
    head = AuditChain.objects.get(key=LEGACY)
    assert (head.seq, head.hash, head.prev_hash) == (5, hashes[4], hashes[3])
    report = verify_chain()
    assert report.ok and report.checked == 5 and report.chains == 1

    new = record_audit(
        actor=system_actor("test"), action="test.new", object_type="user", object_id=1
    )
    assert (new.chain, new.chain_seq, new.prev_hash) == (SYSTEM, 1, GENESIS)
    assert new.seq == 6  # the reading order carries on after the legacy rows
    write_anchor()  # v2, over the legacy and system heads
    full = verify_all(anchors=True)
    assert full["ok"], full
    assert full["anchors"]["anchors"] == 3 and full["chain"]["chains"] == 2

    with connection.cursor() as cur:  # an edit of a legacy row is named in the legacy chain
        cur.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER ALL")
        cur.execute(
            "UPDATE audit_auditevent SET reason = 'rewritten' WHERE chain = 'legacy' AND chain_seq = 2"
        )
        cur.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER ALL")
    report = verify_chain()
    assert (report.ok, report.chain, report.first_broken_seq, report.problem) == (
        False,
        LEGACY,
        2,
        "edited",
    )


def test_a_legacy_tail_cut_is_caught_by_a_v1_anchor():
    _migrate(BEFORE)
    hashes = _write_old_chain(4)
    _v1_anchor(4, hashes[3])
    _migrate(_latest())
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER ALL")
        cur.execute("DELETE FROM audit_auditevent WHERE chain = 'legacy' AND chain_seq > 2")
        cur.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER ALL")
    AuditChain.objects.filter(key=LEGACY).update(seq=2, hash=hashes[1])
    assert verify_chain().ok
    part = verify_all(anchors=True)["anchors"]
    assert (part["problem"], part["chain"], part["first_broken_seq"]) == ("tail_cut", LEGACY, 3)
