"""Forged, backdated audit events (docs/security/audit-forgery.md): what the application's own
database role can append -- a correctly linked and hashed event dated in the past -- is named by
``audit_verify --anchors``; and an anchor trail that stopped (stale, or lines removed) is a failure."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from audit.anchors.signing import key_id, signed_bytes, signing_key
from audit.anchors.sink import DirectorySink
from audit.anchors.write import current_heads, write_anchor
from audit.chain.append import append
from audit.integrity import verify_all
from audit.models import SYSTEM, AuditChain, AuditEvent
from audit.services import audit_event
from core.actors import Actor
from tests.audit.test_anchors import (  # noqa: F401 - the fixture, by name
    _manage,
    _write,
    _write_anchored,
    anchor_config,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only", "anchor_config")]

APRIL = Actor(kind="user", name="april", role="approver", component="console")


def forge(hours_ago: float, *, run_id=None, action="approval.decide") -> AuditEvent:
    """What the app role can do: the ordinary append statement, with a made-up time."""
    event = audit_event(
        actor=APRIL, action=action, object_type="approval", object_id="a-1", run_id=run_id
    )
    event.created_at = timezone.now() - timedelta(hours=hours_ago)
    with transaction.atomic():
        return append(event)


def _report(capsys) -> dict:
    out, _ = capsys.readouterr()
    return json.loads(out.strip().splitlines()[-1])


def test_a_backdated_event_at_the_end_of_a_chain_is_named(capsys):
    _write_anchored(3)
    assert verify_all(anchors=True)["ok"]
    forged = forge(5)
    assert _manage("audit_verify", "--anchors") != 0
    report = _report(capsys)
    chain = report["chain"]
    assert (chain["problem"], chain["first_broken_seq"], chain["chain"]) == (
        "backdated",
        forged.chain_seq,
        SYSTEM,
    ), chain
    assert "approval.decide by april" in chain["detail"]


def test_a_backdated_event_in_a_chain_of_its_own_is_caught_by_the_anchor_alone(capsys):
    """A new chain has nothing to be monotonic against: the last anchor bounds it."""
    import uuid

    _write_anchored(2)
    forged = forge(5, run_id=uuid.uuid4())
    assert verify_all()["ok"], "the chains alone cannot tell"
    assert _manage("audit_verify", "--anchors") != 0
    anchors = _report(capsys)["anchors"]
    assert (anchors["problem"], anchors["chain"], anchors["first_broken_seq"]) == (
        "backdated",
        forged.chain,
        1,
    ), anchors
    assert "written after the anchor, dated before it" in anchors["detail"]


def test_an_event_dated_inside_the_tolerance_of_an_anchor_is_not_forgery():
    _write_anchored(2)
    forge(10 / 3600)  # 10 s ago: a transaction that committed just after the anchor
    assert verify_all(anchors=True)["ok"]


def _old_anchor(at: str) -> None:
    key = signing_key()
    old = {"v": 2, **current_heads(None), "at": at, "key": key_id(key.public_key())}
    old["sig"] = base64.b64encode(key.sign(signed_bytes(old))).decode()
    DirectorySink().append(json.dumps(old))


def test_an_anchor_trail_that_stopped_is_a_failure(settings):
    settings.ANCHOR_INTERVAL_S = 60
    _write(1)
    _old_anchor((timezone.now() - timedelta(hours=2)).isoformat())
    report = verify_all(anchors=True)
    assert not report["ok"] and report["anchors"]["stale"]
    assert report["anchors"]["problem"] == "anchor_stale", report["anchors"]
    # Anchoring again does not launder the hole: an event was written while no anchor was.
    write_anchor()
    report = verify_all(anchors=True)["anchors"]
    assert not report["stale"] and report["problem"] == "anchor_missing", report


def test_all_anchor_lines_but_the_first_deleted_and_a_cut_tail_fail(settings):
    """The issue's case: it used to say ok: true, stale: true."""
    settings.ANCHOR_INTERVAL_S = 60
    _write_anchored(6)
    sink = DirectorySink().path
    first = json.loads(sink.read_text().splitlines()[0])
    # Every line but the first removed; the first as it reads two hours on (re-signed: the test
    # holds the key; the line's content is otherwise the first anchor's).
    key = signing_key()
    first["at"] = (timezone.now() - timedelta(hours=2)).isoformat()
    first["sig"] = base64.b64encode(key.sign(signed_bytes(first))).decode()
    sink.write_text(json.dumps(first) + "\n")
    top = AuditChain.objects.get(key=SYSTEM).seq
    from tests.audit.test_anchors import _at, _set_head, superuser_tampering

    with superuser_tampering():
        AuditEvent.objects.filter(chain=SYSTEM, chain_seq__gt=top - 3).delete()
        _set_head(top - 3, _at(top - 3).get().hash)
    report = verify_all(anchors=True)
    assert not report["ok"], report["anchors"]
    assert report["anchors"]["problem"] in ("anchor_stale", "tail_cut"), report["anchors"]
