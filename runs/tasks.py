"""Periodic jobs. Thin: each calls one service, which re-derives what to do from the database."""
from celery import shared_task

from audit.actors import system_actor
from runs import services


@shared_task(acks_late=True)
def scan_expired_leases() -> list[str]:
    """Find leases that expired without release and mark their runs orphaned (or paused/cancelled)."""
    orphaned = services.expire_leases(actor=system_actor("recovery-scan"))
    try:
        from interventions.recover import on_orphaned
    except ImportError:
        return orphaned
    for run_id in orphaned:
        on_orphaned(run_id)
    return orphaned


@shared_task(acks_late=True)
def fire_due_timers() -> int:
    return services.fire_due_timers(actor=system_actor("timers"))
