"""Periodic jobs of the audit app. Thin: each calls one service."""

import logging

from celery import shared_task

from .anchors.write import AnchorRefused
from .anchors.write import write_anchor as sign_and_append

log = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def write_anchor() -> dict:
    """Beat, every ANCHOR_INTERVAL_S: a fresh signed anchor of the chain head, idle or not."""
    try:
        return sign_and_append()
    except AnchorRefused as exc:
        # No anchor for a head the database contradicts; the gap and this line are the evidence.
        log.error("audit anchor refused: %s", exc)
        return {"refused": str(exc)}
