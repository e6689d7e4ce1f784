"""People reading a run's effects over the API see sensitive args masked by the adapter's redaction
rule, as the console shows them; the worker that declared them reads them as declared."""

from __future__ import annotations

import pytest

from runs.models import Effect
from tests.conftest import claim, declare, start_run

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"


def test_a_person_reads_the_card_masked_and_the_worker_reads_it_as_declared(worker, as_user):
    run = start_run(worker)
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    declared = declare(worker, run["id"], token, args={"amount": 120, "card": CARD})
    assert declared.status_code == 201, declared.content

    seen = as_user("otto").get(f"/runs/{run['id']}/effects")
    assert seen.status_code == 200, seen.content
    (effect,) = seen.json()["effects"]
    assert effect["args"] == {"amount": 120, "card": "••••1111"}
    assert CARD not in seen.content.decode()

    (own,) = worker.get(f"/runs/{run['id']}/effects").json()["effects"]
    assert own["args"]["card"] == CARD
    assert Effect.objects.get(pk=effect["id"]).args["card"] == CARD  # stored as sent
