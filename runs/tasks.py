"""Periodic jobs. Thin: each calls one service, which re-derives what to do from the database."""

from celery import shared_task

from core.actors import system_actor
from runs.services.records import fire_due_timers as fire_timers
from runs.services.tally import compact_tally


@shared_task(acks_late=True)
def fire_due_timers() -> int:
    return fire_timers(actor=system_actor("timers"))


@shared_task(acks_late=True)
def compact_run_tally() -> int:
    return compact_tally()
