"""The interval anchor on real parts: a Celery worker with embedded beat (``-B``) on this test's
PostgreSQL database and Redis, ANCHOR_INTERVAL_S=1. It keeps appending signed anchors of the heads,
also while nothing happens, and ``audit_verify --anchors`` accepts every one of them."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.anchors.merkle import merkle_root
from audit.integrity import verify_all
from audit.models import SYSTEM, AuditChain
from audit.services import record_audit
from core.actors import system_actor
from tests.live import Procs, server_env, start_celery, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]


def test_beat_writes_a_signed_anchor_every_interval_also_when_idle(tmp_path, settings):
    key_file = tmp_path / "signing.pem"
    key_file.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    settings.ANCHOR_DIR, settings.ANCHOR_SIGNING_KEY = str(tmp_path / "anchors"), str(key_file)
    for i in range(3):
        record_audit(actor=system_actor("test"), action="test.event", object_type="t", object_id=i)
    head = AuditChain.objects.get(key=SYSTEM)
    sink = tmp_path / "anchors" / "anchors.jsonl"
    env = server_env(
        tmp_path,
        ANCHOR_INTERVAL_S="1",
        ANCHOR_DIR=settings.ANCHOR_DIR,
        ANCHOR_SIGNING_KEY=str(key_file),
    )
    procs = Procs(tmp_path)
    try:
        start_celery(procs, env, name="anchors", beat=True)

        def lines() -> list[dict]:
            return [json.loads(x) for x in sink.read_text().splitlines()] if sink.exists() else []

        wait_for(
            "three interval anchors",
            lambda: len(lines()) >= 3,
            30,
            logs=(tmp_path / "anchors.log",),
        )
    finally:
        procs.stop()
    written = lines()
    root = merkle_root([(SYSTEM, head.seq, head.hash)])
    assert {(a["root"], a["events"]) for a in written} == {(root, 3)}  # idle: same heads
    assert len({a["at"] for a in written}) == len(written)  # each a fresh anchor
    report = verify_all(anchors=True)
    assert report["ok"] and report["anchors"]["anchors"] == len(written), report
