"""The SDK is typed for its callers (PEP 561 ``py.typed``): mypy, run as an agent author would run
it on their own code, checks a tiny consumer against the SDK's annotations -- the correct consumer
passes ``--strict``, and a wrong use is reported (it would pass unnoticed if the SDK were ``Any``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CONSUMER = """
from controlplane_sdk import Client, EffectScope, RunContext, RunSummary, Worker, run_one
from controlplane_sdk.testing import FakeControlPlane


def agent(ctx: RunContext) -> None:
    token: int = ctx.fencing_token
    with ctx.step("charge"):
        with ctx.effect("payments", "charge", args={"amount": token}) as fx:
            scope: EffectScope = fx
            key: str = scope.idempotency_key
            fx.committed(external_ref=key)


def main() -> RunSummary:
    cp = FakeControlPlane()
    client: Client = cp.client()
    run = cp.create_run("buyer")
    return run_one(Worker(client, "w", "buyer").claim(run, heartbeat=False), agent)
"""

WRONG = """
from controlplane_sdk import RunContext


def agent(ctx: RunContext) -> str:
    return ctx.fencing_token
"""


def mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "consumer.py").write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "consumer.py"],
        cwd=tmp_path,  # outside the repository: no project config, as in the author's own repo
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_package_ships_py_typed():
    import controlplane_sdk

    assert (Path(controlplane_sdk.__file__).parent / "py.typed").is_file()


@pytest.mark.slow
def test_a_consumer_type_checks_strictly_against_the_sdk(tmp_path):
    ok = mypy(tmp_path, CONSUMER)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = mypy(tmp_path, WRONG)
    assert wrong.returncode == 1, wrong.stdout
    assert 'Incompatible return value type (got "int", expected "str")' in wrong.stdout
