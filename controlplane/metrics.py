"""``GET /metrics``: Prometheus text exposition (prometheus-client, no Django integration package).

Counts and ages are read from the database at scrape time by :class:`DatabaseCollector`, so every
server process answers the same. Runs, effects and lease expiries come from the tallies the database
keeps (RunTally, LedgerTally): a scrape reads a few rows whatever the ledger's size (measured by
``bench/metrics_scrape.py``). The broker's queue depths are asked of the broker. The in-process
metrics (core/metrics.py: intervention issue latency, protocol-call latency by endpoint), like the
process_* metrics, describe the process that answered the scrape.

Access: a client address in ``METRICS_ALLOW_IPS`` (default: loopback) or an operator's bearer token
whose user holds the admin role. Anyone else gets 403 (401 for a token that is not valid). A refused
scrape writes no audit event: it changes nothing, and an unauthenticated caller could otherwise fill
the audit chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Min, Sum
from django.db.models.functions import Greatest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from api.auth import TokenAuth
from core import pg
from core.roles import ADMIN
from interventions.models import Intervention
from interventions.models_compensation import CompensationStep
from interventions.models_jobs import Job
from runs.models import Effect, ExecutionLease, LedgerTally, Run, RunTally
from runs.states import State
from runs.team_scope import runs_by_team_and_state, slugs


def _age_s(oldest: datetime | None, now: datetime) -> float:
    return max((now - oldest).total_seconds(), 0.0) if oldest else 0.0


class DatabaseCollector(Collector):
    """Gauges and counters computed from the database on every scrape."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from self._runs()
        yield from _team_runs()
        yield from self._effects(now)
        yield from self._leases()
        yield from self._interventions(now)
        yield from self._compensation(now)
        yield from _broker()
        yield from _anchors()

    def _runs(self) -> Iterator[Metric]:
        runs = GaugeMetricFamily("controlplane_runs", "Runs by state.", labels=["state"])
        if pg.enabled(connection):
            # the database's running tally (RunTally): a few rows whatever the number of runs
            tally = RunTally.objects.values_list("state").annotate(n=Sum("n")).order_by()
            counts = dict(tally)
        else:
            counts = dict(Run.objects.values_list("state").annotate(n=Count("*")).order_by())
        for state in State:  # every state, zeros included, so a dashboard's series never vanish
            runs.add_metric([state.value], counts.get(state.value, 0))
        yield runs

    def _effects(self, now: datetime) -> Iterator[Metric]:
        effects = GaugeMetricFamily(
            "controlplane_effects",
            "Ledger effects by decision and status.",
            labels=["decision", "status"],
        )
        declared = CounterMetricFamily(
            "controlplane_effects_declared",
            "Effects declared, by decision (authorized or denied); only ever grows.",
            labels=["decision"],
        )
        by_status: dict[tuple[str, str], int] = {}
        by_decision: dict[str, int] = {}
        if pg.enabled(connection):
            for series, key, n in _ledger_tally(("effects", "effects_declared")):
                if series == "effects":
                    decision, _, status = key.partition("/")
                    by_status[(decision, status)] = n
                else:
                    by_decision[key] = n
        else:
            rows = Effect.objects.values_list("decision", "status").annotate(n=Count("*"))
            for decision, status, n in rows.order_by():
                by_status[(decision, status)] = n
                by_decision[decision] = by_decision.get(decision, 0) + n
        for (decision, status), n in sorted(by_status.items()):
            if n:
                effects.add_metric([decision, status], n)
        for decision in (Effect.AUTHORIZED, Effect.DENIED):
            declared.add_metric([decision], by_decision.get(decision, 0))
        yield effects
        yield declared
        yield GaugeMetricFamily(
            "controlplane_effects_unknown_outstanding",
            "Effects whose outcome is unknown (may have happened): they wait for reconciliation.",
            value=by_status.get((Effect.AUTHORIZED, Effect.UNKNOWN), 0),
        )
        # only the unknown effects are read (the partial index effect_look_at_run holds them)
        oldest = Effect.objects.filter(status=Effect.UNKNOWN).aggregate(oldest=Min("declared_at"))
        yield GaugeMetricFamily(
            "controlplane_effects_unknown_oldest_age_seconds",
            "Age of the oldest effect still unknown (0 when there is none).",
            value=_age_s(oldest["oldest"], now),
        )

    def _leases(self) -> Iterator[Metric]:
        if pg.enabled(connection):
            expired = sum(n for _, _, n in _ledger_tally(("lease_expiries",)))
        else:
            expired = ExecutionLease.objects.filter(status=ExecutionLease.EXPIRED).count()
        yield CounterMetricFamily(
            "controlplane_lease_expiries",
            "Execution leases that ended expired (their worker stopped heartbeating); only grows.",
            value=expired,
        )

    def _interventions(self, now: datetime) -> Iterator[Metric]:
        issued = CounterMetricFamily(
            "controlplane_interventions",
            "Interventions recorded, by kind and status.",
            labels=["kind", "status"],
        )
        rows = Intervention.objects.values_list("kind", "status").annotate(n=Count("*")).order_by()
        for kind, status, n in rows:
            issued.add_metric([kind, status], n)
        yield issued
        pending_jobs = GaugeMetricFamily(
            "controlplane_intervention_jobs_pending",
            "Follow-up jobs (outbox rows) pending or running, by kind.",
            labels=["kind"],
        )
        oldest_jobs = GaugeMetricFamily(
            "controlplane_intervention_jobs_oldest_pending_age_seconds",
            "Age of the oldest unfinished follow-up job, by kind (0 when there is none).",
            labels=["kind"],
        )
        overdue_jobs = GaugeMetricFamily(
            "controlplane_intervention_jobs_overdue",
            "Unfinished follow-up jobs past their due time: the beat sweep delivers them again.",
            labels=["kind"],
        )
        gave_up = GaugeMetricFamily(
            "controlplane_intervention_jobs_failed",
            "Follow-up jobs that failed after their last attempt (their run needs an operator).",
            labels=["kind"],
        )
        # The outbox, not Intervention.status, says whether a follow-up job is still owed: it also
        # holds compensation plans, and a job row outlives a lost broker message.
        for kind in Job.KINDS:
            open_ = Job.objects.filter(kind=kind, status__in=Job.OPEN)
            pending = open_.aggregate(n=Count("*"), oldest=Min("created_at"))
            overdue = open_.filter(due_at__lt=now).count()
            pending_jobs.add_metric([kind], pending["n"])
            oldest_jobs.add_metric([kind], _age_s(pending["oldest"], now))
            overdue_jobs.add_metric([kind], overdue)
        failed_jobs = (
            Job.objects.filter(status=Job.FAILED).values_list("kind").annotate(n=Count("*"))
        )
        failed = dict(failed_jobs.order_by())
        for kind in Job.KINDS:  # zeros too: an alert on a series that is absent never fires
            gave_up.add_metric([kind], failed.get(kind, 0))
        yield pending_jobs
        yield oldest_jobs
        yield overdue_jobs
        yield gave_up

    def _compensation(self, now: datetime) -> Iterator[Metric]:
        steps = CompensationStep.objects.filter(status__in=CompensationStep.OPEN)
        open_ = steps.aggregate(n=Count("*"), oldest=Min("plan__created_at"))
        yield GaugeMetricFamily(
            "controlplane_compensation_steps_open",
            "Compensation steps pending or running (their plans' jobs are the outbox series, kind compensation).",
            value=open_["n"],
        )
        yield GaugeMetricFamily(
            "controlplane_compensation_steps_oldest_open_age_seconds",
            "Age of the plan of the oldest open compensation step (0 when there is none).",
            value=_age_s(open_["oldest"], now),
        )
        retries = CompensationStep.objects.aggregate(n=Sum(Greatest(F("attempts") - 1, 0)))["n"]
        yield CounterMetricFamily(
            "controlplane_compensation_retries",
            "Compensator calls beyond each step's first (steps are never deleted, so this only grows).",
            value=retries or 0,
        )


def _team_runs() -> Iterator[Metric]:
    """Runs by team and state (docs/operator/teams.md). Not from the tally: RunTally is per agent,
    and a run's team is fixed when it is made (a child takes its parent's; an agent may move), so
    an exact count groups the runs themselves -- one GROUP BY over the run table, which grows with
    it (measured in docs/operations/metrics.md). Every known team and state is reported, zeros
    included, so a dashboard's series never vanish."""
    names = slugs()
    counts = runs_by_team_and_state()
    family = GaugeMetricFamily(
        "controlplane_team_runs", "Runs by team and state.", labels=["team", "state"]
    )
    for team in sorted(names, key=lambda t: names[t]):
        for state in State:
            family.add_metric([names[team], state.value], counts.get((team, state.value), 0))
    yield family


def _ledger_tally(series: tuple[str, ...]) -> list[tuple[str, str, int]]:
    """LedgerTally's sums for ``series`` (runs/models/ledger.py): a few rows per series."""
    rows = LedgerTally.objects.filter(series__in=series).values_list("series", "key")
    return [(a, b, int(n)) for a, b, n in rows.annotate(n=Sum("n")).order_by()]


def _broker() -> Iterator[Metric]:
    """Messages waiting in each Celery queue, asked of the broker (bounded: a broker that does not
    answer within a second is reported down, and the scrape goes on)."""
    from controlplane.celery import app

    depth = GaugeMetricFamily(
        "controlplane_broker_queue_depth",
        "Celery messages waiting in each queue (not yet taken by a worker).",
        labels=["queue"],
    )
    up = 1
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=1)
            channel = conn.default_channel
            for queue in sorted(app.amqp.queues) or [app.conf.task_default_queue]:
                # kombu's virtual transports' own count (Redis: LLEN over the priority lists): a
                # queue nobody has bound yet is 0, where a passive declare would raise
                depth.add_metric([queue], channel._size(queue))
    except Exception:  # a scrape reports the broker down rather than failing whole
        up = 0
    yield depth
    yield GaugeMetricFamily(
        "controlplane_broker_up", "Whether the broker answered this scrape (1) or not (0).", up
    )


def _anchors() -> Iterator[Metric]:
    """When the newest external anchor of the audit chain was written (the sink's last line, read
    from its end), so an alert can say the trail stopped: audit_verify --anchors calls an anchor
    older than three intervals stale (audit/anchors/verify.py)."""
    import json

    from audit.anchors.sink import sink

    at = 0.0
    try:
        last = getattr(sink(), "last", lambda: None)()
        if last:
            at = datetime.fromisoformat(json.loads(last)["at"]).timestamp()
    except Exception:  # an unreadable sink reads as no anchor: the alert fires, which is right
        at = 0.0
    yield GaugeMetricFamily(
        "controlplane_audit_anchor_last_timestamp_seconds",
        "Unix time of the newest external audit anchor (0: none readable from this process).",
        value=at,
    )
    yield GaugeMetricFamily(
        "controlplane_audit_anchor_interval_seconds",
        "ANCHOR_INTERVAL_S: how often the beat writes an anchor (0: anchoring is off).",
        value=settings.ANCHOR_INTERVAL_S,
    )


DATABASE = CollectorRegistry()
DATABASE.register(DatabaseCollector())


def allowed(request: HttpRequest) -> int:
    """200 if the caller may scrape, else the status to refuse it with (401 bad token, 403 otherwise)."""
    if request.META.get("REMOTE_ADDR", "") in settings.METRICS_ALLOW_IPS:
        return 200
    if not request.headers.get("Authorization"):
        return 403
    actor = TokenAuth()(request)  # the API's own token check: revoked tokens are refused there
    if actor is None:
        return 401
    return 200 if not actor.is_worker and ADMIN in actor.roles else 403


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    status = allowed(request)
    if status != 200:
        detail = (
            "invalid token"
            if status == 401
            else "metrics need an admin token or an allowed address"
        )
        return JsonResponse(
            {"error": "forbidden" if status == 403 else "unauthenticated", "detail": detail},
            status=status,
        )
    # The process's own registry (process_*, the intervention histogram) and the database's: two
    # expositions with disjoint names concatenate into one valid document.
    body = generate_latest(REGISTRY) + generate_latest(DATABASE)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
