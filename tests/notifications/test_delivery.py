"""Approvals reach people: a real HTTP receiver and a real SMTP server (aiosmtpd) on loopback, each
its own process; the outbox job retries until the receiver takes the message."""

from __future__ import annotations

import email
import email.policy
import json

import pytest

from audit.models import AuditEvent
from core.actors import system_actor
from core.errors import Invalid
from interventions.models import Job
from notifications import jobs, secrets, services, signing
from notifications.models import Channel, Delivery
from runs.models import Approval
from tests.interventions.helpers import running_run
from tests.notifications.servers import http_receiver, smtp_receiver

pytestmark = pytest.mark.django_db

KEY = "whsec-test-key-0123456789"
ADMIN = system_actor("test-admin")


def _ask(worker, run_id: str) -> str:
    resp = worker.post(
        f"/runs/{run_id}/approvals",
        {"fencing_token": 1, "tool": "payments", "action": "charge", "args": {"amount": 5000}},
    )
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def _webhook(url: str, **extra) -> Channel:
    return services.create_channel(
        actor=ADMIN,
        data={"name": "ops-hook", "kind": "webhook", "url": url, "secret": KEY, **extra},
    )


def _deliver_all() -> None:
    for job in Job.objects.filter(kind=jobs.FAN_OUT, status__in=Job.OPEN):
        jobs.notify_approval(job.target_id)
    for job in Job.objects.filter(kind=jobs.NOTIFY, status__in=Job.OPEN):
        jobs.send_notification(job.target_id)


def test_it_signs_a_webhook_that_the_verifier_accepts_and_a_replay_it_refuses(worker, tmp_path):
    receiver = http_receiver(tmp_path).start()
    try:
        _webhook(f"http://127.0.0.1:{receiver.port}/hook")
        run, _ = running_run(worker)
        approval_id = _ask(worker, run["id"])
        # The request's transaction wrote one outbox row, and sent nothing itself.
        assert Job.objects.filter(kind=jobs.FAN_OUT, target_id=approval_id).count() == 1
        assert receiver.received() == []
        _deliver_all()
        (got,) = receiver.received()
    finally:
        receiver.stop()
    body = got["body"].encode()
    assert signing.verify(KEY, body, got["headers"])
    assert not signing.verify("another-key-0123456789", body, got["headers"])
    assert not signing.verify(KEY, body + b" ", got["headers"])
    ts = int(got["headers"][signing.TIMESTAMP])
    assert not signing.verify(KEY, body, got["headers"], now=ts + signing.REPLAY_WINDOW_S + 1)
    message = json.loads(body)
    assert message["approval"] == approval_id and message["event"] == "approval.requested"
    assert message["link"].endswith(
        f"/runs/{run['id']}/?approval={approval_id}#approval-{approval_id}"
    )
    assert Delivery.objects.get(approval_id=approval_id).status == Delivery.SENT
    assert Job.objects.get(kind=jobs.NOTIFY).status == Job.DONE


def test_a_receiver_down_then_up_gets_the_message_and_five_failures_show_failing(worker, tmp_path):
    receiver = http_receiver(tmp_path)
    channel = _webhook(f"http://127.0.0.1:{receiver.port}/hook")
    run, _ = running_run(worker)
    approval_id = _ask(worker, run["id"])
    jobs.notify_approval(Job.objects.get(kind=jobs.FAN_OUT).target_id)
    delivery = Delivery.objects.get(approval_id=approval_id)
    for _ in range(5):  # nobody listens: each try fails, is counted, and the job stays open
        out = jobs.send_notification(str(delivery.pk))
        assert out["finished"] is False and out["countdown"] > 0
    channel.refresh_from_db()
    assert channel.failing and channel.consecutive_failures == 5
    assert "ConnectError" in channel.last_error
    assert Job.objects.get(kind=jobs.NOTIFY).status in Job.OPEN
    assert services.shown(channel)["failing"] is True
    receiver.start()
    try:
        assert jobs.send_notification(str(delivery.pk))["sent"] is True
        assert len(receiver.received()) == 1
    finally:
        receiver.stop()
    channel.refresh_from_db()
    assert not channel.failing and channel.last_success_at is not None
    assert Job.objects.get(kind=jobs.NOTIFY).status == Job.DONE


def test_it_sends_an_email_through_a_real_smtp_server(worker, tmp_path):
    smtp = smtp_receiver(tmp_path).start()
    try:
        services.create_channel(
            actor=ADMIN,
            data={
                "name": "approvers-mail",
                "kind": "email",
                "smtp_host": "127.0.0.1",
                "smtp_port": smtp.port,
                "from_email": "controlplane@example.test",
                "recipients": ["approvers@example.test"],
                "roles": ["approver"],
            },
        )
        run, _ = running_run(worker)
        approval_id = _ask(worker, run["id"])
        _deliver_all()
        (mail,) = smtp.received()
    finally:
        smtp.stop()
    assert mail["to"] == ["approvers@example.test"]
    parsed = email.message_from_string(mail["data"], policy=email.policy.default)
    text = parsed.get_content()
    assert "payments:charge" in parsed["Subject"] and f"approval={approval_id}" in text


def test_a_slack_channel_gets_an_incoming_webhook_payload(worker, tmp_path):
    receiver = http_receiver(tmp_path).start()
    try:
        channel = services.create_channel(
            actor=ADMIN,
            data={
                "name": "slack",
                "kind": "slack",
                "url": f"http://127.0.0.1:{receiver.port}/T/B/x",
            },
        )
        assert jobs.test_send(actor=ADMIN, channel_id=channel.pk)["sent"] is True
        (got,) = receiver.received()
    finally:
        receiver.stop()
    payload = json.loads(got["body"])
    assert "Test notification" in payload["text"] and payload["blocks"][0]["type"] == "section"
    assert services.shown(channel)["url"] == f"http://127.0.0.1:{receiver.port}/…"


def test_a_channel_that_serves_another_role_is_not_told(worker, tmp_path):
    _webhook("http://127.0.0.1:9/hook", roles=["security_responder"])
    run, _ = running_run(worker)
    _ask(worker, run["id"])
    _deliver_all()
    assert not Delivery.objects.exists()


def test_escalation_resends_to_the_next_role_once_and_leaves_the_deadline_alone(worker, tmp_path):
    receiver = http_receiver(tmp_path).start()
    try:
        _webhook(f"http://127.0.0.1:{receiver.port}/a", escalate_after_s=60, escalate_to="on-call")
        services.create_channel(
            actor=ADMIN,
            data={
                "name": "on-call",
                "kind": "webhook",
                "url": f"http://127.0.0.1:{receiver.port}/oncall",
                "secret": KEY,
                "roles": ["on-call"],
            },
        )
        run, _ = running_run(worker)
        approval_id = _ask(worker, run["id"])
        _deliver_all()
        assert [r["path"] for r in receiver.received()] == ["/a"]
        assert jobs.escalate_due(actor=ADMIN) == []  # not yet 60 s
        Approval.objects.filter(pk=approval_id).update(
            requested_at=Approval.objects.get(pk=approval_id).requested_at
            - __import__("datetime").timedelta(seconds=61)
        )
        assert jobs.escalate_due(actor=ADMIN) == [approval_id]
        assert jobs.escalate_due(actor=ADMIN) == []  # once
        _deliver_all()
        paths = [r["path"] for r in receiver.received()]
    finally:
        receiver.stop()
    assert paths == ["/a", "/oncall"]
    assert json.loads(receiver.received()[1]["body"])["event"] == "approval.escalated"
    assert AuditEvent.objects.filter(action="approval.notification_escalated").count() == 1
    approval = Approval.objects.get(pk=approval_id)
    assert approval.status == Approval.PENDING and approval.deadline is None


def test_a_webhook_url_that_is_not_http_is_refused_naming_the_field():
    for url in ("ftp://example.test/x", "javascript:alert(1)", "example.test"):
        with pytest.raises(Invalid) as caught:
            _webhook(url)
        assert caught.value.extra["field"] == "url"
    assert not Channel.objects.exists()


def test_secrets_are_stored_encrypted_masked_and_changes_are_audited():
    channel = _webhook("https://hooks.example.test/x")
    assert KEY not in channel.secret_encrypted and secrets.decrypt(channel.secret_encrypted) == KEY
    assert KEY not in json.dumps(services.shown(channel))
    services.change_channel(actor=ADMIN, channel_id=channel.pk, data={"enabled": False})
    services.delete_channel(actor=ADMIN, channel_id=channel.pk)
    actions = list(
        AuditEvent.objects.filter(object_type="channel")
        .order_by("seq")
        .values_list("action", flat=True)
    )
    assert actions == ["channel.create", "channel.change", "channel.delete"]
    assert KEY not in json.dumps(list(AuditEvent.objects.values_list("context", flat=True)))


def test_a_policy_step_escalates_to_on_call_without_a_channel_setting(worker, tmp_path):
    """``escalate after 15m to oncall`` in the policy's step, not on the channel."""
    from runs.services.agents import set_approval_policies

    spec = "payments:charge 2*approver escalate after 15m to oncall then security_responder"
    policy = set_approval_policies(actor=ADMIN, agent="purchasing", approvals=[spec])[0]
    assert policy.spec == spec  # the spelling reads back as written
    receiver = http_receiver(tmp_path).start()
    try:
        _webhook(f"http://127.0.0.1:{receiver.port}/a")
        services.create_channel(
            actor=ADMIN,
            data={
                "name": "oncall",
                "kind": "webhook",
                "url": f"http://127.0.0.1:{receiver.port}/oncall",
                "secret": KEY,
                "roles": ["oncall"],
            },
        )
        run, _ = running_run(worker)
        approval_id = _ask(worker, run["id"])
        _deliver_all()
        assert jobs.escalate_due(actor=ADMIN) == []  # not yet 15 minutes
        approval = Approval.objects.get(pk=approval_id)
        steps = approval.steps
        opened = __import__("datetime").datetime.fromisoformat(steps[0]["opened_at"])
        steps[0]["opened_at"] = (opened - __import__("datetime").timedelta(minutes=15)).isoformat()
        Approval.objects.filter(pk=approval_id).update(steps=steps)
        assert jobs.escalate_due(actor=ADMIN) == [approval_id]
        assert jobs.escalate_due(actor=ADMIN) == []  # once
        _deliver_all()
        paths = [r["path"] for r in receiver.received()]
    finally:
        receiver.stop()
    assert sorted(paths) == ["/a", "/oncall"]
    event = AuditEvent.objects.get(action="approval.notification_escalated")
    assert (
        event.context["from_policy_step"] == "approver"
        and event.context["escalated_to"] == "oncall"
    )
    assert Approval.objects.get(pk=approval_id).status == Approval.PENDING


@pytest.mark.parametrize(
    "bad",
    [
        "payments:charge approver escalate after to oncall",
        "payments:charge approver escalate after 15m oncall",
        "payments:charge approver escalate after 0m to oncall",
        "payments:charge approver escalate after 15m to on/call",
    ],
)
def test_a_bad_escalation_spelling_is_refused_naming_it(bad):
    from runs.conditions import ConditionError, parse_policy_spec

    with pytest.raises(ConditionError, match="escalate"):
        parse_policy_spec(bad)
