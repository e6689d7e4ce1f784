"""What a live push costs a protocol call (issue 11: live pushes off the hot path).

In-process, Django test client, the real channel layer of the settings (Redis when REDIS_URL is set),
on_commit callbacks firing for real (transactional test database). Per effect: declare + outcome +
checkpoint on a claimed run. Modes, interleaved round by round so drift hits all alike:
  inline  - the hint is sent inside the request, after COMMIT (what core.live did before)
  offpath - the request only queues the hint; core.live's sender thread sends it (today)
  none    - no hint at all (the floor)
CPU: the request thread's own (thread_time) and the whole process's (process_time, which includes
the sender thread). Run: .venv/bin/python -m pytest -p tests.conftest bench/live_push.py -q -s
"""

from __future__ import annotations

import json
import os
import statistics
import time

import pytest

from core import live
from tests.conftest import claim, declare, start_run

ROUNDS = int(os.environ.get("LIVE_PUSH_ROUNDS", "6"))
EFFECTS = int(os.environ.get("LIVE_PUSH_EFFECTS", "40"))
MODES = ["inline", "offpath", "none"]


def _mode(monkeypatch, mode: str) -> None:
    monkeypatch.undo()
    if mode == "inline":
        monkeypatch.setattr(live, "send_hints", getattr(live, "deliver", live.send_hints))
    elif mode == "none":
        monkeypatch.setattr(live, "send_hints", lambda facts: None)


def _effects(worker, n: int, tag: str) -> None:
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    for i in range(n):
        effect = declare(worker, run["id"], token, key=f"{tag}-{i}").json()
        body = {"fencing_token": token, "status": "committed"}
        assert worker.post(f"/effects/{effect['id']}/outcome", body).status_code == 200
        body = {"fencing_token": token, "step": f"s{i}"}
        assert worker.post(f"/runs/{run['id']}/checkpoints", body).status_code in (200, 201)


@pytest.mark.django_db(transaction=True)
def test_live_push_cost(worker, monkeypatch):
    flush = getattr(live, "flush", lambda timeout=5.0: None)
    _effects(worker, 5, "warm")  # imports, caches, connections
    samples: dict[str, dict[str, list[float]]] = {
        m: {"thread": [], "process": [], "wall": []} for m in MODES
    }
    for r in range(ROUNDS):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            _mode(monkeypatch, mode)
            flush()
            t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
            _effects(worker, EFFECTS, f"{mode}-{r}")
            t1, w1 = time.thread_time(), time.perf_counter()
            flush()  # the sender thread's work counts in process CPU
            p1 = time.process_time()
            samples[mode]["thread"].append((t1 - t0) * 1000 / EFFECTS)
            samples[mode]["process"].append((p1 - p0) * 1000 / EFFECTS)
            samples[mode]["wall"].append((w1 - w0) * 1000 / EFFECTS)
    monkeypatch.undo()
    summary = {
        m: {k: round(statistics.median(v), 2) for k, v in s.items()} for m, s in samples.items()
    }
    summary["layer"] = os.environ.get("REDIS_URL") and "redis" or "in-memory"
    summary["rounds"], summary["effects_per_round"] = ROUNDS, EFFECTS
    print("\nms per effect (declare+outcome+checkpoint), median of rounds:")
    print(json.dumps(summary, indent=1))
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/live_push.json", "w") as fh:
        json.dump(summary, fh, indent=1)
