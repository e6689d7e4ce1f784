"""The live console's socket against a real daphne (Redis channel layer, PostgreSQL sessions) and a
real WebSocket client: the Origin must match scheme, host and port; unknown paths close with 4404;
a third socket of one session is refused; logging out closes the open socket with 4401 within
seconds (the periodic check is set to 30 s here, so the logout's own push does it); and with no
DEBUG in the environment an unknown page is the plain 404 while the console's CSS is still served."""

from __future__ import annotations

import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.live import Procs, log_in, server_env, start_daphne

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live_console(postgres_only, tmp_path):
    procs = Procs(tmp_path)
    env = server_env(tmp_path, WS_MAX_PER_SESSION="2", WS_SESSION_CHECK_S="30")
    env.pop("DEBUG")  # the default, as a fresh deployment would have it
    try:
        yield start_daphne(procs, env, ready_path="/accounts/login/")
    finally:
        procs.stop()


def _server_password(user, raw: str) -> None:
    """The suite hashes with MD5 for speed; the server process only knows its real hashers."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(raw, hasher.salt())
    user.save(update_fields=["password"])


def _open(base: str, browser: httpx.Client, path: str = "/ws/runs/", origin: str | None = None):
    ws_url = base.replace("http://", "ws://") + path
    return connect(
        ws_url,
        origin=origin or base,
        additional_headers={"Cookie": f"sessionid={browser.cookies['sessionid']}"},
        open_timeout=10,
    )


def _close_code(socket, within: float) -> int | None:
    """Read pushed pages until the server closes; its close code (None: still open)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.recv(timeout=max(deadline - time.monotonic(), 0.01))
        except TimeoutError:
            return None
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
    return None


def test_the_socket_is_same_origin_capped_and_ends_with_the_login(cast, live_console):
    _server_password(cast["otto"][0], "pw-otto")
    base = live_console
    otto = log_in(base, "otto")

    with _open(base, otto) as first:
        assert "run-table" in first.recv(timeout=10)  # the fresh render on connect

        port = int(base.rsplit(":", 1)[1])
        foreign_origins = (
            f"http://127.0.0.1:{port + 1}",  # same host, another port
            f"https://127.0.0.1:{port}",  # same host and port, another scheme
            "http://evil.example",
        )
        for foreign in foreign_origins:
            with pytest.raises(InvalidStatus) as refused:
                _open(base, otto, origin=foreign)
            assert refused.value.response.status_code == 403

        with _open(base, otto, path="/ws/no/such/path/") as lost:
            assert _close_code(lost, 5) == 4404

        with _open(base, otto):  # WS_MAX_PER_SESSION=2: a third is refused
            with pytest.raises(InvalidStatus):
                _open(base, otto)

        page = otto.get("/no-such-page/")
        assert page.status_code == 404 and "URLconf" not in page.text
        assert otto.get("/static/console/console.css").status_code == 200  # without DEBUG

        started = time.monotonic()
        response = otto.post(
            "/accounts/logout/", headers={"X-CSRFToken": otto.cookies["csrftoken"]}
        )
        assert response.status_code == 302
        assert _close_code(first, 10) == 4401
        assert time.monotonic() - started < 10

    from audit.models import AuditEvent

    actions = list(AuditEvent.objects.filter(actor="otto").values_list("action", flat=True))
    assert actions == ["login", "logout"]
