"""Notifications on real parts: a Celery worker with its embedded beat (``celery worker -B``) on a
Redis database of this test, PostgreSQL, and a real HTTP receiver process. The approval request only
writes its outbox row; the worker delivers the signed webhook, and the beat's ``escalate-approvals``
task re-sends the still-pending approval to the on-call channel."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from audit.models import AuditEvent
from core.actors import system_actor
from notifications import services, signing
from runs.models import Approval
from tests.e2e.test_celery_worker import Process
from tests.interventions.helpers import running_run
from tests.live import test_database_url, wait_for
from tests.notifications.servers import http_receiver

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]

ROOT = Path(__file__).resolve().parents[2]
KEY = "whsec-worker-key-0123456789"
ADMIN = system_actor("test-admin")


@pytest.fixture
def broker():
    """A Redis database of this test's own (flushed), for the worker and this process's Celery app."""
    from urllib.parse import urlsplit, urlunsplit

    import redis

    from controlplane.celery import app

    base = os.environ.get("REDIS_URL", "")
    if not base:
        pytest.skip("needs Redis (REDIS_URL)")
    url = urlunsplit(urlsplit(base)._replace(path="/8"))
    client = redis.Redis.from_url(url)
    client.flushdb()
    old = app.conf.broker_url
    app.conf.broker_url, app._pool, app.amqp._producer_pool = url, None, None
    yield url
    app.conf.broker_url, app._pool, app.amqp._producer_pool = old, None, None
    client.flushdb()
    client.close()


def test_a_real_worker_delivers_signed_and_its_beat_escalates_to_on_call(worker, broker, tmp_path):
    receiver = http_receiver(tmp_path).start()
    celery = None
    try:
        url = f"http://127.0.0.1:{receiver.port}"
        services.create_channel(
            actor=ADMIN,
            data={
                "name": "approvers",
                "kind": "webhook",
                "url": f"{url}/approvers",
                "secret": KEY,
                "escalate_after_s": 2,
                "escalate_to": "on-call",
            },
        )
        services.create_channel(
            actor=ADMIN,
            data={
                "name": "on-call",
                "kind": "webhook",
                "url": f"{url}/oncall",
                "secret": KEY,
                "roles": ["on-call"],
            },
        )
        env = {
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "REDIS_URL": broker,
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "RECOVERY_SCAN_INTERVAL_S": "1",
            "ANCHOR_INTERVAL_S": "0",
            "DB_POOL_MIN": "1",
            "PYTHONUNBUFFERED": "1",
        }
        celery = Process(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "controlplane",
                "worker",
                "-B",
                "-s",
                str(tmp_path / "beat-schedule"),
                "-l",
                "info",
                "-P",
                "solo",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"notify-{uuid.uuid4().hex[:6]}@%h",
            ],
            tmp_path / "celery.log",
            env,
        )
        celery.wait_for_line(r"ready\.", 60)
        run, _ = running_run(worker)
        answer = worker.post(
            f"/runs/{run['id']}/approvals",
            {"fencing_token": 1, "tool": "payments", "action": "charge", "args": {"amount": 5000}},
        )
        assert answer.status_code == 201, answer.content
        approval_id = answer.json()["id"]

        def paths():
            return [r["path"] for r in receiver.received()]

        logs = (tmp_path / "celery.log",)
        wait_for("the worker's delivery", lambda: "/approvers" in paths(), 30, 0.1, logs=logs)
        first = receiver.received()[0]
        assert signing.verify(KEY, first["body"].encode(), first["headers"])
        assert json.loads(first["body"])["event"] == "approval.requested"
        # Not decided within 2 s: the beat's escalate-approvals re-sends it to on-call, once.
        wait_for("the beat's escalation", lambda: "/oncall" in paths(), 40, 0.2, logs=logs)
        escalated = [r for r in receiver.received() if r["path"] == "/oncall"][0]
        assert signing.verify(KEY, escalated["body"].encode(), escalated["headers"])
        body = json.loads(escalated["body"])
        assert body["event"] == "approval.escalated" and body["approval"] == approval_id
        assert f"?approval={approval_id}" in body["link"]
        assert AuditEvent.objects.filter(action="approval.notification_escalated").count() == 1
        assert Approval.objects.get(pk=approval_id).status == Approval.PENDING
    finally:
        if celery is not None:
            celery.stop()
        receiver.stop()
    assert paths().count("/oncall") == 1 and paths().count("/approvers") == 1
