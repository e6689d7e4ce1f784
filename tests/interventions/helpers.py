"""Helpers for intervention tests: a running run with effects, and issuing through the API."""

from __future__ import annotations

from tests.conftest import Api, claim, declare, start_run


def running_run(worker: Api, **overrides) -> tuple[dict, dict]:
    run = start_run(worker, **overrides)
    return run, claim(worker, run["id"])


def commit(worker: Api, run_id: str, token: int, key: str, **overrides) -> dict:
    resp = declare(worker, run_id, token, key=key, **overrides)
    assert resp.status_code == 201, resp.content
    effect = resp.json()
    out = worker.post(
        f"/effects/{effect['id']}/outcome",
        {"fencing_token": token, "status": "committed", "external_ref": f"ref-{key}"},
    )
    assert out.status_code == 200, out.content
    return effect


def intervene(api: Api, run_id: str, kind: str, reason: str = "on-call decision", **body):
    return api.post(f"/runs/{run_id}/interventions", {"kind": kind, "reason": reason, **body})
