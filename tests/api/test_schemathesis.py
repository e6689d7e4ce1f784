"""No input ever yields a 5xx: a bounded schemathesis run over the app's own OpenAPI document.

Requests go through the real ASGI application (the same stack daphne serves), so sync views run in
Django's thread executor with their own database connection: the seeded agent, token, run, lease
and effect are committed (``transaction=True``) for them to see.

Three callers, each with the path ids pinned to a real run, lease and effect (so generated bodies reach
the services, not just the 404 at the door): a worker token, and an admin's operator token (the audit
and run-control endpoints), and a viewer's operator token (refused by role: schema-conforming inputs
only). Each operation gets schema-conforming and, for the first two, schema-violating inputs.
(schemathesis's own pytest plugin does not run on pytest 9, so the operations are driven here with
its strategies and its ``not_a_server_error`` check.)
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from core.actors import Actor
from runs.models import Agent, ApiToken
from runs.services import effects, lifecycle
from tests.conftest import PURCHASING_SCOPES

WORKER = Actor(kind="worker", name="fuzz-worker", role="worker")
EXAMPLES_PER_OPERATION = 6  # derandomized: the same cases each run; 10 cost the suite ~20 s more
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


def _seed() -> dict[str, str]:
    Agent.objects.create(name="purchasing", allowed_scopes=PURCHASING_SCOPES)
    run = lifecycle.create_run(
        actor=WORKER,
        agent="purchasing",
        goal="fuzz target",
        authority=[{"scope": "payments:charge", "ttl_s": 3600}],
    )
    claim = lifecycle.claim_run(actor=WORKER, run_id=run.pk, worker="fuzz-worker")
    effect = effects.declare_effect(
        actor=WORKER,
        run_id=run.pk,
        fencing_token=1,
        step="charge",
        tool="payments",
        action="charge",
        idempotency_key="fuzz-1",
        args={"amount": 1},
    ).effect
    return {"run_id": str(run.pk), "lease_id": str(claim.lease.pk), "effect_id": str(effect.pk)}


def _token(caller: str) -> str:
    if caller == "viewer":  # issue 19: refusals by role (audit reading, run control) are 4xx too
        from django.contrib.auth.models import Group, User

        vera = User.objects.create_user("vera", password="pw-vera")
        vera.groups.add(Group.objects.get_or_create(name="viewer")[0])
        return ApiToken.issue(kind=ApiToken.OPERATOR, name="vera-token", user=vera)[1]
    if caller == "operator":
        from django.contrib.auth.models import User

        admin = User.objects.create_superuser("ada", password="pw-ada")
        return ApiToken.issue(kind=ApiToken.OPERATOR, name="ada-token", user=admin)[1]
    return ApiToken.issue(kind=ApiToken.WORKER, name="fuzz-worker", agents=["purchasing"])[1]


@pytest.fixture(scope="module", autouse=True)
def _stop_the_asgi_event_loop():
    """schemathesis serves the app from one long-lived event loop; stopping it cancels the app's
    background tasks (the heartbeat's LISTEN connection), so the test database can be dropped."""
    yield
    from schemathesis.python import asgi

    asgi._shutdown()


def _fuzz(operation, mode: GenerationMode, headers: dict, pinned: dict | None) -> str | None:
    """Run one operation in one mode; the failure (with a curl reproduction) or None."""
    strategy = operation.as_strategy(mode, path_parameters=pinned or None)

    @hypothesis_settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case):
        case.call_and_validate(headers=headers, checks=[not_a_server_error])

    try:
        check()
    except (
        Unsatisfiable
    ):  # nothing in this operation can be made invalid (e.g. no parameters at all)
        return None
    except Exception as exc:
        return f"{operation.label} [{mode.value}]: {exc}"
    return None


@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("caller", ["worker", "operator", "viewer"])
def test_no_generated_request_yields_a_server_error(postgres_only, caller, settings):
    from controlplane.asgi import application

    settings.HEARTBEAT_MAX_WAIT_S = (
        0.2  # a generated long-poll on the live lease must not stall the run
    )

    ids = _seed()
    headers = {"Authorization": f"Bearer {_token(caller)}"}
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", application)
    failures, operations = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        pinned = {k: v for k, v in ids.items() if f"{{{k}}}" in operation.path}
        # A viewer's refusals come before any body is read: schema-conforming inputs reach them all.
        modes = [GenerationMode.POSITIVE] if caller == "viewer" else list(MODES)
        for mode in modes:
            failure = _fuzz(operation, mode, headers, pinned)
            if failure:
                failures.append(failure)
    assert operations >= 15  # the worker protocol and audit surface are all in the document
    assert not failures, "\n\n".join(failures)
