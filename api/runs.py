"""Worker protocol endpoints (docs/concepts/worker-protocol.md). Thin: parse, authorise the caller kind,
call one service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest
from ninja import Query, Router
from ninja.responses import Status

from api import responses as out
from api.auth import caller, refuse
from api.responses import ERRORS_READ, ERRORS_WRITE
from api.schemas import (
    ApprovalIn,
    CheckpointIn,
    ClaimIn,
    EffectIn,
    EventsIn,
    FinishIn,
    HeartbeatIn,
    LedgerFilter,
    OutcomeIn,
    ReleaseIn,
    RunIn,
    RunListQuery,
)
from audit.services import snapshot
from core.actors import Actor
from core.drain import is_draining
from core.errors import DomainError, Invalid, NotFound
from core.redaction import stored_args
from core.roles import may
from interventions.registry import redact
from runs import selectors
from runs.directive_bus import get_bus
from runs.models import Run
from runs.search import RunFilter, page_runs
from runs.selectors import approval_progress, run_summary, woken_directive
from runs.services import effects, lifecycle, records
from runs.states import directive_for

router = Router(tags=["worker protocol"])


def _worker(request: HttpRequest) -> Actor:
    actor: Actor = caller(request)
    if not actor.is_worker:
        raise refuse(request, "only worker tokens may make worker-protocol writes")
    return actor


class _Fixed:
    """id -> a fact about that row which never changes once the row exists, remembered per server
    process once found (only found answers: a missing row is asked about again), bounded."""

    def __init__(self, lookup: Callable[[str], Any], limit: int = 10_000) -> None:
        self.lookup, self.limit = lookup, limit
        self.known: dict[str, Any] = {}

    def __call__(self, key):
        key = str(key)
        value = self.known.get(key)
        if value is None:
            value = self.lookup(key)
            if value is not None:
                self.remember(key, value)
        return value

    def remember(self, key, value) -> None:
        if len(self.known) >= self.limit:
            self.known.clear()
        self.known[str(key)] = value


# run id -> (the name of its agent, its team id or 0), for the scope check below. A run's agent and
# team are fixed when the run is created and never change, and agents are registered by name (never
# renamed; runs PROTECT them). It saves the check's query on every call but a run's first per process.
_run_agent = _Fixed(
    lambda run_id: Run.objects.filter(pk=run_id).values_list("agent__name", "team_id").first()
)
# effect id -> its run's id (an effect never moves to another run), for the outcome's run lock and
# scope check: learnt from the declaration's own answer, so an outcome sent to the server that
# declared its effect (the worker's keep-alive connection, and ``next`` on one) needs no query.
_effect_run = _Fixed(effects.effect_run_id)
# lease id -> its run's id (a lease never moves to another run), for heartbeats and releases.
_lease_run = _Fixed(lifecycle.lease_run_id)


def _worker_for_run(request: HttpRequest, run_id, absent: NotFound | None = None) -> Actor:
    """``absent``: the 404 to answer for a run the token may not know of, when the caller named
    another object (a lease, an effect) -- never one that names the run."""
    actor = _worker(request)
    # A token scoped to some agents, and every token to its team, must not learn of other agents'
    # or teams' runs: 404, as if absent -- and a missing run answers here too, before the service
    # checks the body, so a bad body cannot tell an absent run from a hidden one.
    known = _run_agent(run_id) if run_id is not None else None
    if (
        known is None
        or (actor.agents and known[0] not in actor.agents)
        or not actor.in_team(known[1])
    ):
        raise absent or NotFound(f"run {run_id} does not exist", object="run")
    return actor


@router.post("/runs", response={201: out.RunDetailOut, **ERRORS_WRITE})
def create_run(request: HttpRequest, body: RunIn):
    actor: Actor = caller(request)
    if not actor.is_worker and not may(actor.roles, "start_run"):
        raise refuse(request, "your role may not start runs")
    run = lifecycle.create_run(
        actor=actor,
        agent=body.agent,
        goal=body.goal,
        input=body.input,
        parent_run_id=body.parent_run_id,
        versions=body.versions,
        authority=[g.dict() for g in body.authority],
        deadline=body.deadline,
        retry_policy=body.retry_policy.model_dump(exclude_unset=True),
    )
    return Status(201, selectors.run_detail(run))


@router.get("/runs", response={200: out.RunListOut, **ERRORS_READ})
def list_runs(request: HttpRequest, query: Query[RunListQuery]):
    """Runs of a filter, newest first unless ``sort`` says otherwise; a bad parameter is a 400
    naming it. Any unique id prefix: ``?id=3f9a2c1b``."""
    # The schema documents and bounds the parameters; the filter reads the query string itself, so
    # repeated ones (agent=a&agent=b) count.
    flt = RunFilter.from_query(request.GET)
    page = page_runs(
        caller(request), flt, after=query.after or "", before=query.before or "", limit=query.limit
    )
    return {
        "runs": [run_summary(r, getattr(r, "n_unresolved", None)) for r in page.runs],
        "next_cursor": page.next_cursor,
        "prev_cursor": page.prev_cursor,
    }


@router.get("/runs/{run_id}", response={200: out.RunDetailOut, **ERRORS_READ})
def get_run(request: HttpRequest, run_id: UUID):
    return selectors.run_detail(selectors.get_visible_run(caller(request), run_id))


@router.get("/runs/{run_id}/effects", response={200: out.EffectListOut, **ERRORS_READ})
def list_effects(request: HttpRequest, run_id: UUID, filters: Query[LedgerFilter]):
    """The ledger, oldest first; ``status`` keeps one status (a receipt's link to the effects past
    its first page)."""
    actor = caller(request)
    rows = selectors.ledger(selectors.get_visible_run(actor, run_id), status=filters.status or "")
    if not actor.is_worker:
        # People read args through the adapters' redaction rules, as in the console; the worker
        # that declared them (it may act for the run's agent) reads them as declared.
        rows = [e | {"args": redact(e["tool"], e["args"])} for e in rows]
    return {"effects": rows}


@router.get("/runs/{run_id}/history", response={200: out.HistoryOut, **ERRORS_READ})
def get_history(request: HttpRequest, run_id: UUID):
    with (
        snapshot()
    ):  # the run's head and its events from one snapshot, while workers keep appending
        run = selectors.get_visible_run(caller(request), run_id)
        return {
            "events": [
                {
                    "seq": h.seq,
                    "kind": h.kind,
                    "actor": h.actor,
                    "data": h.data,
                    "created_at": h.created_at.isoformat(),
                    "hash": h.hash,
                }
                for h in run.history.order_by("seq")
            ],
            "integrity": selectors.verify_history(run),
        }


@router.post("/runs/{run_id}/claim", response={200: out.ClaimOut, **ERRORS_WRITE})
def claim(request: HttpRequest, run_id: UUID, body: ClaimIn):
    actor = _worker_for_run(request, run_id)
    return lifecycle.claim_run(
        actor=actor, run_id=run_id, worker=body.worker, versions=body.versions
    ).as_dict()


def _lease_run_id(request: HttpRequest, lease_id: UUID):
    run_id = _lease_run(lease_id)
    absent = NotFound(f"lease {lease_id} does not exist", object="lease")
    _person_knows(request, run_id, absent)
    _worker_for_run(request, run_id, absent)
    return str(run_id)


def _person_knows(request: HttpRequest, run_id, absent: NotFound) -> None:
    """A person at a worker write named by a lease or an effect: the lookup already told a missing
    one (404), so another team's answers 404 too; their own team's, the usual 403 (``_worker``)."""
    actor = caller(request)
    if not actor.is_worker and selectors.visible_run(actor, run_id) is None:
        raise absent


@router.post("/leases/{lease_id}/heartbeat", response={200: out.HeartbeatOut, **ERRORS_WRITE})
async def heartbeat(request: HttpRequest, lease_id: UUID, body: HeartbeatIn):
    """Keeps the lease and returns the directive. With ``wait_s`` it long-polls: it answers as soon
    as the directive changes (woken by PostgreSQL NOTIFY), or when ``wait_s`` passes."""
    run_id = await sync_to_async(_lease_run_id)(request, lease_id)

    async def beat():
        return await sync_to_async(lifecycle.heartbeat)(
            actor=caller(request),
            lease_id=lease_id,
            fencing_token=body.fencing_token,
            run_id=run_id,
        )

    bus = get_bus()
    wait_s = min(body.wait_s, settings.HEARTBEAT_MAX_WAIT_S, max(settings.LEASE_TTL_S - 5, 1))
    if wait_s <= 0:
        return (await beat()).as_dict()
    # Subscribe before the first read, so a change committed in between still wakes us.
    listening = await bus.start()
    event = bus.subscribe(run_id)
    try:
        first = await beat()
        if first.directive not in ("continue", "wait") or first.timers:
            return first.as_dict()
        loop_deadline = _now() + wait_s
        while True:
            await bus.wait(event, loop_deadline - _now(), listening)
            if is_draining():  # answer now; the gate adds the reconnect header (core/drain.py)
                return (await beat()).as_dict()
            if not listening and _now() < loop_deadline:
                # No NOTIFY (SQLite): the bus re-checks every FALLBACK_POLL_S, so read the state
                # rather than write a beat each time.
                if directive_for(await sync_to_async(_run_state)(run_id)) == first.directive:
                    continue
            if listening and _now() < loop_deadline:
                # Woken: answer from one read, no transaction (a beat's lock, writes and COMMIT were
                # most of a wake-up under load). A wake-up that changed nothing (a late outcome's
                # notify, say) keeps waiting without writing; the first beat holds the lease.
                woken = await sync_to_async(woken_directive)(
                    run_id=run_id, lease_id=lease_id, fencing_token=body.fencing_token
                )
                if woken is not None:
                    if woken["directive"] != first.directive:
                        return woken
                    continue
            # Out of time, or only a beat can answer (the lease is no longer ours, timers wait):
            # beat again, one transaction.
            latest = await beat()
            if latest.directive != first.directive or latest.timers or _now() >= loop_deadline:
                return latest.as_dict()
    finally:
        bus.unsubscribe(run_id, event)


def _now() -> float:
    import time

    return time.monotonic()


def _run_state(run_id: str) -> str:
    from runs.models import Run

    return Run.objects.values_list("state", flat=True).get(pk=run_id)


@router.post("/leases/{lease_id}/release", response={200: out.RunStateOut, **ERRORS_WRITE})
def release(request: HttpRequest, lease_id: UUID, body: ReleaseIn):
    """The worker acknowledges pause/cancel at a step boundary and gives the lease back."""
    _lease_run_id(request, lease_id)
    run = lifecycle.release_lease(
        actor=caller(request),
        lease_id=lease_id,
        fencing_token=body.fencing_token,
        reason=body.reason,
    )
    return {"run_id": str(run.pk), "state": run.state}


@router.post(
    "/runs/{run_id}/effects",
    response={
        **ERRORS_WRITE,
        200: out.EffectOut,
        201: out.EffectOut,
        409: out.EffectDeniedOut,
    },
)
def declare_effect(request: HttpRequest, run_id: UUID, body: EffectIn):
    status, payload = _declare(_worker_for_run(request, run_id), run_id, body)
    return Status(status, payload)


def _declare(actor: Actor, run_id, body: EffectIn) -> tuple[int, dict]:
    result = effects.declare_effect(
        actor=actor,
        run_id=run_id,
        fencing_token=body.fencing_token,
        step=body.step,
        tool=body.tool,
        action=body.action,
        idempotency_key=body.idempotency_key,
        args=stored_args(body.args),
        compensation=body.compensation.dict() if body.compensation else None,
        irreversible=body.irreversible,
        approval_id=body.approval_id,
    )
    payload = result.as_dict()
    if payload.get("id") and payload.get("run_id"):
        _effect_run.remember(payload["id"], UUID(str(payload["run_id"])))
    if result.decision == "denied":
        return 409, {"error": "denied", **payload}
    return (201 if result.decision == "authorized" else 200), payload


@router.post("/effects/{effect_id}/outcome", response={200: out.OutcomeOut, **ERRORS_WRITE})
def record_outcome(request: HttpRequest, effect_id: UUID, body: OutcomeIn):
    run_id = _effect_run(effect_id)
    gone = NotFound(f"effect {effect_id} does not exist", object="effect")
    _person_knows(request, run_id, gone)
    actor = _worker_for_run(request, run_id, gone)
    if body.checkpoint is not None and body.fencing_token is None:
        raise Invalid("a checkpoint needs the lease's fencing_token", field="fencing_token")
    recorded = effects.record_outcome_with(
        actor=actor,
        effect_id=effect_id,
        fencing_token=body.fencing_token,
        status=body.status,
        external_ref=body.external_ref,
        detail=body.detail,
        run_id=run_id,
        checkpoint=body.checkpoint.dict() if body.checkpoint is not None else None,
    )
    answer = selectors.effect_dict(recorded.effect)
    if recorded.checkpoint is not None:
        cp = recorded.checkpoint
        answer["checkpoint"] = {"id": cp.pk, "seq": cp.seq, "step": cp.step, "hash": cp.hash}
    elif recorded.checkpoint_refused is not None:
        answer["checkpoint"] = {"field": ""} | recorded.checkpoint_refused.payload()
    if body.next is not None:
        answer["next"] = _ride_along(actor, run_id, body.next)
    return answer


def _ride_along(actor: Actor, run_id, body: EffectIn) -> dict:
    """The next declaration, carried by an outcome: its own decision (transaction) after the outcome's,
    answered as POST /runs/{id}/effects would, with that call's status in ``http_status``."""
    try:
        status, payload = _declare(actor, run_id, body)
    except DomainError as err:
        return {"http_status": err.status, "field": ""} | err.payload()
    return {"http_status": status, **payload}


@router.post("/runs/{run_id}/checkpoints", response={201: out.CheckpointWrittenOut, **ERRORS_WRITE})
def write_checkpoint(request: HttpRequest, run_id: UUID, body: CheckpointIn):
    actor = _worker_for_run(request, run_id)
    cp = records.write_checkpoint(
        actor=actor,
        run_id=run_id,
        fencing_token=body.fencing_token,
        step=body.step,
        state=body.state,
    )
    return Status(201, {"id": cp.pk, "seq": cp.seq, "step": cp.step, "hash": cp.hash})


@router.post("/runs/{run_id}/events", response={201: out.EventsAppendedOut, **ERRORS_WRITE})
def append_events(request: HttpRequest, run_id: UUID, body: EventsIn):
    actor = _worker_for_run(request, run_id)
    seqs = records.append_events(
        actor=actor,
        run_id=run_id,
        fencing_token=body.fencing_token,
        events=[e.dict() for e in body.events],
    )
    return Status(201, {"seqs": seqs})


@router.post("/runs/{run_id}/approvals", response={201: out.ApprovalRequestedOut, **ERRORS_WRITE})
def request_approval(request: HttpRequest, run_id: UUID, body: ApprovalIn):
    actor = _worker_for_run(request, run_id)
    approval = records.request_approval(
        actor=actor,
        run_id=run_id,
        fencing_token=body.fencing_token,
        tool=body.tool,
        action=body.action,
        args=stored_args(body.args),  # masked alike, so the approval's digest still matches
        reason=body.reason,
        deadline_s=body.deadline_s,
        required_role=body.required_role,
    )
    return Status(
        201,
        {
            "id": str(approval.pk),
            "status": approval.status,
            "digest": approval.digest,
            "required_role": approval.required_role,
            "policy": approval.policy.spec if approval.policy else None,
            "deadline": approval.deadline.isoformat() if approval.deadline else None,
            "progress": approval_progress(approval) if approval.steps else None,
        },
    )


@router.post("/runs/{run_id}/finish", response={200: out.RunStateOut, **ERRORS_WRITE})
def finish(request: HttpRequest, run_id: UUID, body: FinishIn):
    actor = _worker_for_run(request, run_id)
    run = lifecycle.finish_attempt(
        actor=actor,
        run_id=run_id,
        fencing_token=body.fencing_token,
        outcome=body.outcome,
        failure_class=body.failure_class,
        error=body.error,
    )
    return {"id": str(run.pk), "state": run.state}
