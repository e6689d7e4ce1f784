"""POST /work/claim: a worker waits for its next run instead of listing runs. It answers the oldest
claimable run at once, long-polls (woken by NOTIFY when a run becomes claimable), respects the token's
agents, and two workers racing for one run get it once between them."""

from __future__ import annotations

import json
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import AsyncClient

from runs.models import ApiToken, Run
from tests.conftest import Api, start_run


def _work_over_asgi(token: str, body: dict) -> tuple[int, dict, float]:
    async def call():
        started = time.monotonic()
        resp = await AsyncClient().post(
            "/api/v1/work/claim",
            data=json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        return resp.status_code, json.loads(resp.content), time.monotonic() - started

    return async_to_sync(call)()


@pytest.mark.django_db
def test_it_claims_the_oldest_claimable_run_of_the_agent(worker):
    first, second = start_run(worker), start_run(worker)
    resp = worker.post("/work/claim", {"worker": "w-1", "agents": ["purchasing"]})
    assert resp.status_code == 200, resp.content
    claim = resp.json()["claim"]
    assert claim["run_id"] == first["id"] and claim["lease"]["fencing_token"] == 1
    assert Run.objects.get(pk=first["id"]).state == "running"
    again = worker.post("/work/claim", {"worker": "w-2"}).json()["claim"]
    assert again["run_id"] == second["id"]
    assert worker.post("/work/claim", {"worker": "w-3"}).json() == {"claim": None}


@pytest.mark.django_db
def test_a_token_never_claims_another_agents_run(worker, client):
    start_run(worker)
    _, other = ApiToken.issue(kind=ApiToken.WORKER, name="other", agents=["refunds"])
    stranger = Api(client, other)
    resp = stranger.post("/work/claim", {"worker": "w-x", "agents": ["purchasing"]})
    assert resp.status_code == 200 and resp.json() == {"claim": None}
    assert Run.objects.filter(state="queued").count() == 1


@pytest.mark.django_db
def test_only_worker_tokens_claim_work(as_user):
    resp = as_user("otto").post("/work/claim", {"worker": "w"})
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"


@pytest.mark.django_db(transaction=True)
def test_a_waiting_worker_is_woken_when_a_run_is_created(postgres_only, worker, worker_token):
    def create_later():
        try:
            time.sleep(1.0)
            start_run(worker)
        finally:
            connection.close()

    creator = threading.Thread(target=create_later)
    creator.start()
    status, body, elapsed = _work_over_asgi(
        worker_token, {"worker": "w-1", "agents": ["purchasing"], "wait_s": 20}
    )
    creator.join(timeout=10)
    assert status == 200 and body["claim"] is not None, body
    assert 0.9 <= elapsed < 5, elapsed  # woken by the run's creation, well before wait_s


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_for_one_run_get_it_once(postgres_only, worker, worker_token):
    run = start_run(worker)
    results: list[dict] = []

    def race(name: str):
        try:
            results.append(_work_over_asgi(worker_token, {"worker": name, "wait_s": 0})[1])
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(f"w-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    won = [r["claim"] for r in results if r["claim"] is not None]
    assert len(results) == 4 and len(won) == 1 and won[0]["run_id"] == run["id"]
    assert Run.objects.get(pk=run["id"]).fencing_token == 1
