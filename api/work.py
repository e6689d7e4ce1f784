"""``POST /work/claim``: a worker asks for its next run and waits for one (long-poll), instead of
listing runs every few seconds. The claim itself is the ordinary claim service, so a wake-up that
several workers race for is settled by the run's row lock: one wins, the others look again."""

from __future__ import annotations

import time
from typing import Annotated, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest
from ninja import Router
from pydantic import Field

from api import responses as out
from api.auth import caller, refuse
from api.schemas import Schema
from core.actors import Actor
from core.drain import is_draining
from core.errors import LeaseHeld, NotClaimable
from runs import work
from runs.directive_bus import get_bus
from runs.services import lifecycle

router = Router(tags=["worker protocol"])


class WorkIn(Schema):
    worker: str = Field(min_length=1, max_length=150)
    agents: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default_factory=list, max_length=50
    )
    versions: dict[str, Any] = {}
    wait_s: float = Field(default=0, ge=0, le=60)


def _agents(request: HttpRequest, body: WorkIn) -> dict[str, int]:
    actor = caller(request)
    if not actor.is_worker:
        raise refuse(request, "only worker tokens may claim work")
    if body.agents:
        names = [n for n in body.agents if not actor.agents or n in actor.agents]
        return work.agent_ids(names, actor)
    return work.agent_ids(list(actor.agents) or None, actor)


def _try_claim(actor: Actor, ids: list[int], body: WorkIn) -> dict[str, Any] | None:
    for run_id in work.claimable_runs(ids, body.worker, actor=actor):
        try:
            claim = lifecycle.claim_run(
                actor=actor, run_id=run_id, worker=body.worker, versions=body.versions
            )
        except (LeaseHeld, NotClaimable):
            continue  # another worker won this one
        return {"run_id": run_id, **claim.as_dict()}
    return None


@router.post("/work/claim", response={200: out.WorkOut, **out.ERRORS_WRITE})
async def claim_work(request: HttpRequest, body: WorkIn):
    """The oldest claimable run of the given agents (default: every agent the token may act for),
    claimed for this worker; ``{"claim": null}`` if none became claimable within ``wait_s``."""
    ids = await sync_to_async(_agents)(request, body)
    if not ids:
        return {"claim": None}
    bus = get_bus()
    keys = [work.work_key(i) for i in ids.values()]
    listening = await bus.start() if body.wait_s > 0 else False
    # Subscribe before the first look: a run queued in between still wakes us.
    event = bus.subscribe_keys(keys)
    deadline = time.monotonic() + min(body.wait_s, settings.HEARTBEAT_MAX_WAIT_S)
    try:
        while True:
            claimed = await sync_to_async(_try_claim)(caller(request), list(ids.values()), body)
            remaining = deadline - time.monotonic()
            if claimed is not None or remaining <= 0 or is_draining():
                return {"claim": claimed}
            due = await sync_to_async(work.next_due)(
                list(ids.values()), body.worker, caller(request)
            )
            if due is not None:  # a run in retry backoff: wake when it becomes claimable
                remaining = min(remaining, max(due.timestamp() - time.time(), 0.05))
            await bus.wait(event, remaining, listening)
    finally:
        bus.unsubscribe_keys(keys, event)
