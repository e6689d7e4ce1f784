"""The image and the compose stack (Dockerfile, compose.yaml, docs/operations/container.md): the
stack starts from the images `make image` built, migrations run once, and the console, the API, the
probes and a WebSocket answer through the proxy; the API runs as a non-root user.

Slow (the stack takes a minute or two to come up): it runs under `make compose-test` (CI: .ci/run,
time-bounded), which builds the images first; a plain pytest run skips it, saying so, unless
CONTROLPLANE_COMPOSE_TEST=1. Without a Docker daemon it is skipped with that reason."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.live import ROOT, free_port

pytestmark = [pytest.mark.slow]
IMAGES = {
    "CONTROLPLANE_IMAGE": "controlplane:local",
    "POSTGRES_IMAGE": "controlplane-postgres:local",
    "REDIS_IMAGE": "controlplane-redis:local",
    "PROXY_IMAGE": "controlplane-haproxy:local",
}
UP_WITHIN_S = 300  # a loaded 2-core machine: the first console page alone took 10 s


def _compose() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return ["docker", "compose"]


@pytest.fixture
def stack(tmp_path: Path):
    if os.environ.get("CONTROLPLANE_COMPOSE_TEST") != "1":
        pytest.skip(
            "the compose stack test runs under `make compose-test` (CONTROLPLANE_COMPOSE_TEST=1)"
        )
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True).returncode != 0:
        pytest.skip("no Docker daemon could be reached (make compose-test starts Debian's dockerd)")
    for image in IMAGES.values():
        if subprocess.run([docker, "image", "inspect", image], capture_output=True).returncode:
            pytest.fail(f"image {image} is missing: `make image` builds it")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = tmp_path / "anchor-signing-key.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chown(key, 10001, 10001)
    key.chmod(0o400)
    port = free_port()
    project = f"cptest{os.getpid()}"
    env = dict(
        os.environ,
        **IMAGES,
        PROXY_PORT=str(port),
        SECRET_KEY=secrets.token_urlsafe(48),
        ANCHOR_SIGNING_KEY_FILE=str(key),
        ALLOWED_HOSTS="localhost,127.0.0.1",
    )
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    base = [*_compose(), "-p", project, "-f", str(ROOT / "compose.yaml")]

    def compose(*args: str, check: bool = True, timeout: float = 120) -> str:
        done = subprocess.run(
            [*base, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode:
            raise AssertionError(
                f"compose {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        return done.stdout

    try:
        compose("up", "-d", "--no-build", timeout=300)
        yield {"url": f"http://127.0.0.1:{port}", "compose": compose}
    finally:
        subprocess.run(
            [*base, "logs", "--no-color"],
            env=env,
            cwd=ROOT,
            timeout=60,
            stdout=(tmp_path / "compose.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        subprocess.run(
            [*base, "down", "-v", "--remove-orphans"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            timeout=180,
        )


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None


def test_the_stack_answers_through_the_proxy(stack):
    url, compose = stack["url"], stack["compose"]
    deadline = time.monotonic() + UP_WITHIN_S
    while time.monotonic() < deadline:
        ready = _get(f"{url}/readyz")
        if ready is not None and ready.status_code == 200:
            break
        time.sleep(2)
    else:
        raise AssertionError(
            f"not ready through the proxy in {UP_WITHIN_S}s:\n"
            + compose("logs", "--no-color", "--tail", "40")
        )
    assert ready.json()["status"] == "ready", ready.text
    assert all(c["ok"] for c in ready.json()["checks"].values())

    login = httpx.get(f"{url}/accounts/login/", timeout=60)
    assert login.status_code == 200 and 'name="password"' in login.text
    css = httpx.get(f"{url}/static/console/console.css", timeout=60)
    assert css.status_code == 200
    refused = httpx.get(f"{url}/api/v1/runs", timeout=60)
    assert refused.status_code == 401 and refused.headers["content-type"].startswith(
        "application/json"
    )

    # a WebSocket upgrade passes the proxy and reaches daphne (which refuses a socket without login)
    code = None
    try:
        with connect(url.replace("http", "ws") + "/ws/runs/", origin=url, open_timeout=60) as ws:
            ws.recv(timeout=60)
    except InvalidStatus as exc:
        code = exc.response.status_code
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd else None
    assert code in (403, 4401), code

    states = compose("ps", "-a")
    assert "Exit 0" in states or "exited (0)" in states.lower(), states  # migrate ran once
    for service in ("api1", "api2", "worker", "beat", "proxy"):
        assert service in states
    assert compose("exec", "-T", "api1", "id", "-u").strip() == "10001"
    assert compose("exec", "-T", "worker", "id", "-u").strip() == "10001"
