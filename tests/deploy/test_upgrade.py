"""Two releases side by side during a deploy (docs/operations/upgrades.md), on real processes: the
previous release's API code (``upgrades.PREVIOUS_RELEASE``, extracted with ``git archive``) serves on
the schema this release's migrations made, driven by this release's SDK; and this release's server
serves the previous release's SDK, refusing a protocol version it does not speak by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane import upgrades
from controlplane_sdk import Client
from tests.deploy.hosts import start_api, start_redis
from tests.e2e.test_socket_daphne import _server_password
from tests.live import ROOT, log_in, server_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WHERE = (
    "import controlplane, controlplane_sdk; print(controlplane.__file__, controlplane_sdk.__file__)"
)
# The previous SDK's side, run in its own interpreter so its package is the one imported.
OLD_SDK = """
import json, sys, httpx, controlplane_sdk
from controlplane_sdk import Client
base, token = sys.argv[1], sys.argv[2]
with Client(base, token, timeout=30) as sdk:
    run = sdk.create_run("purchasing", "old sdk", versions={"code": "1.0.0"},
                         authority=[{"scope": "payments:charge", "ttl_s": 3600}])
    fencing = sdk.claim(run["id"], "worker-old").lease.fencing_token
    effect = sdk.declare_effect(run["id"], fencing, step="charge", tool="payments",
                                action="charge", idempotency_key="old-1", args={"amount": 1})
    sdk.record_outcome(effect.id, fencing, "committed", external_ref="old-1")
    sdk.finish(run["id"], fencing, "succeeded")
    status = sdk.get_run(run["id"])["state"]
future = httpx.get(base + "/api/v1/runs", headers={"Authorization": "Bearer " + token,
                                                   "X-Controlplane-Protocol": "99"})
print(json.dumps({"sdk": controlplane_sdk.__file__, "run": run["id"], "status": status,
                  "future": [future.status_code, future.text]}))
"""


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    """The previous release's tree (its own code and SDK; the current venv's libraries)."""
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{upgrades.PREVIOUS_RELEASE}^{{commit}}"],
        capture_output=True,
    )
    if known.returncode != 0:
        pytest.skip(f"the previous release {upgrades.PREVIOUS_RELEASE} is not in this clone's git")
    tree = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", upgrades.PREVIOUS_RELEASE],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def _imports_from(cwd: Path, env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", WHERE], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_previous_release_serves_the_current_sdk_on_the_new_schema(
    procs, tmp_path, previous_release, worker_token, cast
):
    env = server_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{start_redis(procs)}/0")
    # the schema is this release's: pytest-django migrated the test database with its migrations
    current = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--check"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert current.returncode == 0, current.stdout + current.stderr
    server_code, _ = _imports_from(previous_release, env)
    assert server_code.startswith(str(previous_release)), server_code
    base, log = start_api(procs, env, name="previous-api", cwd=previous_release)

    with Client(base, worker_token, timeout=30) as sdk:
        run = sdk.create_run(
            "purchasing", "side by side", versions={"code": "1.0.0"},
            authority=[{"scope": "payments:charge", "ttl_s": 3600}],
        )  # fmt: skip
        fencing = sdk.claim(run["id"], "worker-new").lease.fencing_token
        effect = sdk.declare_effect(
            run["id"], fencing, step="charge", tool="payments", action="charge",
            idempotency_key="side-1", args={"amount": 1},
        )  # fmt: skip
        sdk.record_outcome(effect.id, fencing, "committed", external_ref="side-1")
        sdk.finish(run["id"], fencing, "succeeded")
        assert sdk.get_run(run["id"])["state"] == "succeeded"
        assert [e["id"] for e in sdk.list_effects(run["id"])] == [effect.id]
    _server_password(cast["otto"][0], "pw-otto")
    page = log_in(base, "otto").get(f"/runs/{run['id']}/")
    assert page.status_code == 200 and "side by side" in page.text, page.text[:500]
    assert "Traceback" not in log.read_text()


def test_the_current_server_serves_the_previous_sdk_and_names_a_version_it_does_not_speak(
    procs, tmp_path, previous_release, worker_token
):
    env = server_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{start_redis(procs)}/0")
    base, _ = start_api(procs, env)
    old_sdk = dict(env, PYTHONPATH=str(previous_release / "sdk" / "src"))
    out = subprocess.run(
        [sys.executable, "-c", OLD_SDK, base, worker_token], cwd=tmp_path, env=old_sdk,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["sdk"].startswith(str(previous_release)), result["sdk"]
    assert result["status"] == "succeeded"
    status, body = result["future"]
    assert status == 400 and "protocol_version_unsupported" in body and "99" in body, body
    assert os.path.exists(previous_release / "sdk" / "src" / "controlplane_sdk" / "client.py")
