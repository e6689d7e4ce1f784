"""Single sign-on against a real OpenID Connect provider process (tests/identity/conftest.py)."""

from __future__ import annotations

import pytest
import requests
from django.contrib.auth import get_user_model

from audit.models import AuditEvent
from core.roles import roles_of

from .conftest import sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def _events(action: str):
    return list(AuditEvent.objects.filter(action=action).order_by("id"))


def test_login_page_offers_the_provider(live_server, sso):
    page = requests.get(f"{live_server.url}/accounts/login/", timeout=10)
    assert "Sign in with Test IdP" in page.text


def test_an_idp_login_signs_in_with_the_mapped_roles_and_is_audited(live_server, sso):
    http, answer = sign_in(live_server.url, "sam")
    assert answer.status_code == 200, answer.text[:500]
    assert answer.url.startswith(live_server.url)
    user = get_user_model().objects.get(username="sam")
    assert sorted(roles_of(user)) == ["approver", "security_responder"]
    assert not user.has_usable_password()
    change = _events("sso_roles_change")[-1]
    assert change.context["granted"] == ["approver", "security_responder"]
    assert change.context["ignored_groups"] == ["ops-leads"]  # unknown group: ignored, named
    login = _events("login")[-1]
    assert login.context == {"method": "oidc"}
    # Signed in: the console answers, and the logout is audited.
    assert http.get(f"{live_server.url}/", timeout=10).url.startswith(f"{live_server.url}/")
    csrf = http.cookies.get("csrftoken")
    http.post(
        f"{live_server.url}/accounts/logout/",
        data={"csrfmiddlewaretoken": csrf},
        headers={"Referer": live_server.url + "/"},
        timeout=10,
    )
    assert _events("logout")


def test_a_role_the_idp_no_longer_grants_is_removed_at_the_next_login(live_server, sso):
    sign_in(live_server.url, "ana")
    user = get_user_model().objects.get(username="ana")
    assert sorted(roles_of(user)) == ["operator"]
    sso.set_users({"ana": ["secops"]})
    sign_in(live_server.url, "ana")
    assert sorted(roles_of(user)) == ["approver", "security_responder"]
    change = _events("sso_roles_change")[-1]
    assert change.context["removed"] == ["operator"]


def test_groups_that_grant_no_role_get_a_clear_page_and_no_role(live_server, sso):
    sign_in(live_server.url, "ana")
    sso.set_users({"ana": ["marketing"]})
    http, answer = sign_in(live_server.url, "ana")
    assert answer.status_code == 403
    assert "grant no role" in answer.text and "marketing" in answer.text
    assert not roles_of(get_user_model().objects.get(username="ana"))
    refused = _events("sso_login_refused")[-1]
    assert refused.outcome == AuditEvent.DENIED and refused.context["ignored_groups"] == [
        "marketing"
    ]
    # Not signed in: the console sends them to the login page.
    assert "/accounts/login/" in http.get(f"{live_server.url}/", timeout=10).url


def test_a_tampered_state_is_refused_with_400_and_audited(live_server, sso):
    http, callback = sign_in(live_server.url, "sam", stop_at_callback=True)
    target = callback.headers["Location"].replace("state=", "state=x")
    answer = http.get(target, timeout=10)
    assert answer.status_code == 400 and "state" in answer.text
    assert "unknown or expired" in _events("sso_login_refused")[-1].reason
    assert not get_user_model().objects.filter(username="sam").exists()


def test_a_state_from_another_session_is_refused(live_server, sso):
    _, callback = sign_in(live_server.url, "sam", stop_at_callback=True)
    answer = requests.get(callback.headers["Location"], timeout=10)  # no session: expired state
    assert answer.status_code == 400 and "unknown or expired" in answer.text
    assert _events("sso_login_refused")[-1].outcome == AuditEvent.DENIED
    assert not get_user_model().objects.filter(username="sam").exists()


def test_an_idp_login_never_takes_over_a_local_account(live_server, sso):
    get_user_model().objects.create_user("root", password="local-pass-1")
    _, answer = sign_in(live_server.url, "root")
    assert answer.status_code == 403 and "local account" in answer.text
    assert not roles_of(get_user_model().objects.get(username="root"))


def _local_login(base: str, username: str, password: str) -> requests.Response:
    http = requests.Session()
    page = http.get(f"{base}/accounts/login/", timeout=10)
    csrf = http.cookies["csrftoken"]
    return http.post(
        page.url,
        data={"csrfmiddlewaretoken": csrf, "username": username, "password": password},
        headers={"Referer": page.url},
        timeout=10,
    )


def test_local_login_is_break_glass_admins_only_then_off(live_server, sso, settings):
    from django.contrib.auth.models import Group

    User = get_user_model()
    User.objects.create_user("ops", password="local-pass-1").groups.add(
        Group.objects.get_or_create(name="operator")[0]
    )
    User.objects.create_user("glass", password="local-pass-1").groups.add(
        Group.objects.get_or_create(name="admin")[0]
    )
    settings.LOCAL_LOGIN = "admins"
    assert "/accounts/login/" in _local_login(live_server.url, "ops", "local-pass-1").url
    assert "/accounts/login/" not in _local_login(live_server.url, "glass", "local-pass-1").url
    settings.LOCAL_LOGIN = "off"
    assert "/accounts/login/" in _local_login(live_server.url, "glass", "local-pass-1").url
    page = requests.get(f"{live_server.url}/accounts/login/", timeout=10).text
    assert 'name="password"' not in page and "Sign in with Test IdP" in page


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OIDC_GROUP_ROLES": "payments-ops=superhero"}, "OIDC_GROUP_ROLES"),
        ({"OIDC_GROUP_ROLES": "no-equals-sign"}, "OIDC_GROUP_ROLES"),
        ({"LOCAL_LOGIN": "sometimes"}, "LOCAL_LOGIN"),
    ],
)
def test_a_bad_identity_setting_stops_start_up_naming_it(env, named):
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and named in done.stderr


def test_without_a_client_id_there_is_no_sso(client, settings):
    settings.OIDC_RP_CLIENT_ID = ""
    assert "Sign in with" not in client.get("/accounts/login/").content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
