"""A real OpenID Connect provider process (django-oauth-toolkit in tests/identity/provider) on a
loopback port, and an HTTP client that walks the authorization-code flow through it."""

from __future__ import annotations

import html
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
USERS = {
    "ana": ["payments-ops"],
    "sam": ["secops", "ops-leads"],
    "nobody": ["marketing"],
    "root": ["payments-ops"],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Idp:
    def __init__(self, directory: Path, redirect_uri: str) -> None:
        self.dir = directory
        self.redirect_uri = redirect_uri
        self.port = _free_port()
        # 127.0.0.1, not the live server's "localhost": cookies do not tell ports apart.
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.identity.provider.settings",
            "IDP_DIR": str(directory),
            "PYTHONPATH": str(ROOT),
        }
        self.proc: subprocess.Popen | None = None

    def manage(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "django", *args],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
        )

    def set_users(self, users: dict[str, list[str]], renames: dict[str, str] | None = None) -> None:
        spec = json.dumps(
            {"users": users, "renames": renames or {}, "redirect_uri": self.redirect_uri}
        )
        subprocess.run(
            [sys.executable, str(ROOT / "tests/identity/provider/seed.py"), spec],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        self.manage("migrate", "--noinput")
        self.set_users(USERS)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django",
                "runserver",
                "--noreload",
                "--nothreading",
                f"127.0.0.1:{self.port}",
            ],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(f"{self.url}/o/.well-known/openid-configuration/", timeout=2)
                return
            except requests.ConnectionError:
                time.sleep(0.2)
        raise RuntimeError("the test IdP did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def idp(live_server, tmp_path_factory):
    server = Idp(tmp_path_factory.mktemp("idp"), f"{live_server.url}/oidc/callback/")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sso(settings, idp):
    settings.OIDC_PROVIDER_NAME = "Test IdP"
    settings.OIDC_RP_CLIENT_ID = "controlplane"
    settings.OIDC_RP_CLIENT_SECRET = "cp-secret"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{idp.url}/o/authorize/"
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{idp.url}/o/token/"
    settings.OIDC_OP_USER_ENDPOINT = f"{idp.url}/o/userinfo/"
    settings.OIDC_OP_JWKS_ENDPOINT = f"{idp.url}/o/.well-known/jwks.json"
    settings.OIDC_GROUP_ROLES = {
        "payments-ops": ["operator"],
        "secops": ["security_responder", "approver"],
    }
    idp.set_users(USERS)
    return idp


_INPUT = re.compile(r'name="(csrfmiddlewaretoken|next)" value="([^"]*)"')


def sign_in(base_url: str, username: str, *, stop_at_callback: bool = False):
    """Walk the authorization-code flow as a browser would: start at the controlplane, post the
    IdP's login form, follow the redirects back. Returns (session, last response)."""
    http = requests.Session()
    page = http.get(f"{base_url}/oidc/authenticate/", timeout=10)
    assert "/login/" in page.url, page.url
    fields = {key: html.unescape(value) for key, value in _INPUT.findall(page.text)}
    form = {**fields, "username": username, "password": "idp-pass-1"}
    answer = http.post(page.url, data=form, allow_redirects=not stop_at_callback, timeout=20)
    while stop_at_callback and answer.is_redirect:
        target = answer.headers["Location"]
        if "/oidc/callback/" in target:
            return http, answer
        answer = http.get(requests.compat.urljoin(answer.url, target), allow_redirects=False)
    return http, answer
