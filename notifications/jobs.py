"""Delivery through the outbox (interventions/jobs.py): never inside the decision's transaction,
retried with backoff until the receiver takes it.

* The approval request adds one job row in its own transaction (``on_approval_requested``, kind
  ``notify_approval``). Its delivery fans out: one :class:`Delivery` and one ``notify`` job per
  channel that serves the approval's role, or lists ``team:SLUG`` for a team one of its steps names.
* A ``notify`` delivery sends one message (network I/O, no transaction open). A failure is counted
  on the delivery and on the channel (failures in a row, the last error) and the job comes back after
  a doubling backoff, capped -- it is never given up, so a receiver that is down and then up gets it.
* ``escalate_approvals`` (beat): an approval still pending ``escalate_after_s`` after its request is
  sent again to the channels serving the channel's ``escalate_to`` role or group, audited. The
  deadline (``timed_out``, interventions/approvals.py) is not touched.

Both kinds are jobs about no single run (``run`` is None): a notification that cannot be sent never
moves a run to needs_attention; the channel and run pages show it instead.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor, system_actor
from core.live import announce
from interventions import jobs
from interventions.models import Job
from notifications.messages import message_for
from notifications.models import FAILING_AFTER, Channel, Delivery
from notifications.transports import send
from runs.models import Approval

log = logging.getLogger(__name__)

FAN_OUT, NOTIFY = "notify_approval", "notify"


def backoff_s(failures: int) -> float:
    """The outbox's doubling wait at notifications' own pace (a receiver can be down for long)."""
    return jobs.backoff_s(
        failures,
        base=float(getattr(settings, "NOTIFY_RETRY_BACKOFF_S", 5)),
        cap=float(getattr(settings, "NOTIFY_RETRY_MAX_S", 600)),
    )


def on_approval_requested(approval: Approval) -> None:
    """Inside the request's transaction: the job row commits with the approval or not at all."""
    jobs.enqueue(FAN_OUT, approval.pk, None, timeout_s=60)


# -- fan-out ------------------------------------------------------------------------------------------


def _add_delivery(channel: Channel, approval: Approval, reason: str) -> Delivery | None:
    """Inside a transaction: one delivery and its job, or None if this one exists already."""
    try:
        with transaction.atomic():  # a savepoint: the unique constraint says "sent already"
            delivery = Delivery.objects.create(
                channel=channel, approval=approval, run_id=approval.run_id, reason=reason
            )
    except IntegrityError:
        return None
    jobs.enqueue(NOTIFY, delivery.pk, None, timeout_s=60)
    return delivery


def fan_out(approval_id: Any) -> dict[str, Any]:
    with transaction.atomic():
        approval = Approval.objects.filter(pk=approval_id).first()
        if approval is None or approval.status != Approval.PENDING:
            return {"skipped": "not pending"}
        added = [
            str(c.pk)
            for c in Channel.objects.filter(enabled=True)
            if c.serves_approval(approval) and _add_delivery(c, approval, Delivery.REQUESTED)
        ]
    return {"deliveries": added}


@shared_task(acks_late=True)
def notify_approval(approval_id: str) -> dict[str, Any]:
    return jobs.perform(FAN_OUT, approval_id, lambda: fan_out(approval_id))


# -- one message --------------------------------------------------------------------------------------


def attempt(delivery_id: Any) -> dict[str, Any]:
    """One try. Sent: done. Failed: counted on the delivery and the channel; ``countdown`` says when
    the job comes back."""
    delivery = Delivery.objects.select_related("channel", "approval").filter(pk=delivery_id).first()
    if delivery is None or delivery.status == Delivery.SENT:
        return {"finished": True}
    channel, now = delivery.channel, timezone.now()
    try:
        send(channel, message_for(delivery))  # network I/O: no transaction is open here
    except Exception as exc:
        error = str(exc)[:1000] or type(exc).__name__
        Delivery.objects.filter(pk=delivery.pk).update(attempts=F("attempts") + 1, last_error=error)
        Channel.objects.filter(pk=channel.pk).update(
            consecutive_failures=F("consecutive_failures") + 1,
            last_error=error,
            last_failure_at=now,
        )
        failures = delivery.attempts + 1
        if channel.consecutive_failures + 1 >= FAILING_AFTER:  # failing (now or still): say so live
            announce_channel_health(channel.pk, delivery.run_id)
        return {"finished": False, "error": error, "countdown": backoff_s(failures)}
    Delivery.objects.filter(pk=delivery.pk).update(
        attempts=F("attempts") + 1, status=Delivery.SENT, sent_at=now, last_error=""
    )
    Channel.objects.filter(pk=channel.pk).update(consecutive_failures=0, last_success_at=now)
    if channel.failing:  # it was failing: the banners go away
        announce_channel_health(channel.pk, delivery.run_id)
    return {"finished": True, "sent": True}


def announce_channel_health(channel_id: Any, run_id: Any) -> None:
    """The channel's health changed what the run pages of its undelivered approvals show (the
    "channel failing" banner): a live fact to each of those runs, so an open page redraws its header
    (console/run_page.py) without a reload."""
    runs = set(
        Delivery.objects.filter(channel_id=channel_id)
        .exclude(status=Delivery.SENT)
        .values_list("run_id", flat=True)
        .distinct()[:500]
    )
    for rid in runs | {run_id}:
        if rid is not None:
            announce(rid, "notification", channel_id)


@shared_task(acks_late=True)
def send_notification(delivery_id: str) -> dict[str, Any]:
    """Thin: one try; if it failed, come back after the backoff (a new message; the sweep delivers
    it again if that message is lost)."""
    outcome = jobs.perform(
        NOTIFY,
        delivery_id,
        lambda: attempt(delivery_id),
        finished=lambda out: bool(out.get("finished")),
        come_back_in=lambda out: float(out.get("countdown") or 0),
    )
    if outcome.get("countdown") is not None:
        jobs.deliver(NOTIFY, str(delivery_id), countdown=outcome["countdown"])
    return outcome


def test_send(*, actor: Actor, channel_id: Any) -> dict[str, Any]:
    """The channel page's button: one message now, its result in place. Counts on the channel's
    health like any delivery, and is audited (who tested which channel, and what happened)."""
    channel = Channel.objects.get(pk=channel_id)
    delivery = Delivery.objects.create(channel=channel, reason=Delivery.TEST)
    result = attempt(delivery.pk)
    outcome = "sent" if result.get("sent") else f"failed: {result.get('error')}"
    record_audit(
        actor=actor,
        action="channel.test_send",
        object_type="channel",
        object_id=channel.pk,
        reason=outcome,
        context={"delivery": str(delivery.pk), "sent": bool(result.get("sent"))},
    )
    return {"sent": bool(result.get("sent")), "error": result.get("error", "")}


def _gave_up(job: Job) -> None:
    # Only the sweep gives up (its messages lost JOB_MAX_ATTEMPTS times): keep the reason visible.
    Delivery.objects.filter(pk=job.target_id).update(
        last_error=f"outbox gave up: {job.last_error}"[:1000]
    )


jobs.register_kind(FAN_OUT, notify_approval, lambda job: None)
jobs.register_kind(NOTIFY, send_notification, _gave_up)


# -- escalation ---------------------------------------------------------------------------------------


def escalate_due(*, actor: Actor, now=None) -> list[str]:
    """Re-send pending approvals undecided within a channel's escalation time to the next role or
    on-call group. One transaction per approval and channel; the unique delivery makes a second
    scan a no-op."""
    now = now or timezone.now()
    escalated = []
    sources = list(Channel.objects.filter(enabled=True, escalate_after_s__isnull=False))
    for source in sources:
        if not source.escalate_to:
            continue
        cutoff = now - timedelta(seconds=source.escalate_after_s or 0)
        due = Approval.objects.filter(status=Approval.PENDING, requested_at__lte=cutoff)
        targets = [
            c
            for c in Channel.objects.filter(enabled=True)
            if source.escalate_to in c.roles and c.pk != source.pk
        ]
        for approval in due:
            if not source.serves_approval(approval):
                continue
            with transaction.atomic():
                added = [
                    str(t.pk) for t in targets if _add_delivery(t, approval, Delivery.ESCALATED)
                ]
                if not added:
                    continue
                record_audit(
                    actor=actor,
                    action="approval.notification_escalated",
                    object_type="approval",
                    object_id=approval.pk,
                    run_id=approval.run_id,
                    reason=f"pending {source.escalate_after_s}s without a decision",
                    context={
                        "from_channel": source.name,
                        "escalated_to": source.escalate_to,
                        "channels": added,
                        "required_role": approval.required_role,
                    },
                )
                escalated.append(str(approval.pk))
    escalated += _escalate_steps(actor=actor, now=now)
    return escalated


def _escalate_steps(*, actor: Actor, now) -> list[str]:
    """A policy's own escalation (``2*approver escalate after 15m to oncall``): a step of the open
    stage still pending ``escalate_after_s`` after the stage opened is re-sent to the channels serving
    ``escalate_to``. Once per approval and channel (the unique delivery), audited like a channel's."""
    escalated = []
    channels = list(Channel.objects.filter(enabled=True))
    pending = Approval.objects.filter(status=Approval.PENDING).exclude(steps=[])
    for approval in pending:
        for step in approval.steps:
            after, to = step.get("escalate_after_s"), step.get("escalate_to")
            named = f"team:{step['team']}" if step.get("team") else step.get("role")
            if not (after and to and step.get("stage") == approval.stage and step.get("opened_at")):
                continue
            opened = datetime.fromisoformat(step["opened_at"])
            if opened + timedelta(seconds=after) > now:
                continue
            with transaction.atomic():
                added = [
                    str(c.pk)
                    for c in channels
                    if to in c.roles and _add_delivery(c, approval, Delivery.ESCALATED)
                ]
                if not added:
                    continue
                record_audit(
                    actor=actor,
                    action="approval.notification_escalated",
                    object_type="approval",
                    object_id=approval.pk,
                    run_id=approval.run_id,
                    reason=f"step {named} pending {after}s without a decision",
                    context={
                        "from_policy_step": named,
                        "stage": approval.stage,
                        "escalated_to": to,
                        "channels": added,
                        "required_role": approval.required_role,
                    },
                )
                escalated.append(str(approval.pk))
    return escalated


@shared_task(acks_late=True)
def escalate_approvals() -> list[str]:
    return escalate_due(actor=system_actor("notifications-escalation"))
