"""People are bound by the IdP's issuer + subject, not by username (audit.models.SsoIdentity); the
session is refreshed with prompt=none; logout ends the IdP's session too. Against the real
django-oauth-toolkit provider process of tests/identity/conftest.py."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from audit.access import sso as sso_rules
from audit.models import AuditEvent, SsoIdentity
from core.roles import roles_of

from .conftest import sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def _events(action: str):
    return list(AuditEvent.objects.filter(action=action).order_by("id"))


def test_an_idp_rename_keeps_the_account_and_is_audited(live_server, sso):
    sso.set_users({"rita": ["payments-ops"]})
    sign_in(live_server.url, "rita")
    user = get_user_model().objects.get(username="rita")
    identity = SsoIdentity.objects.get(user=user)
    assert identity.issuer == f"{sso.url}/o" and identity.subject
    sso.set_users({}, renames={"rita": "rita-renamed"})  # same person at the IdP, a new name
    _, answer = sign_in(live_server.url, "rita-renamed")
    assert answer.status_code == 200, answer.text[:300]
    user.refresh_from_db()
    assert user.username == "rita-renamed" and get_user_model().objects.count() == 1
    rename = _events("sso_user_rename")[-1]
    assert rename.outcome == AuditEvent.ALLOWED
    assert (rename.context["before"], rename.context["after"]) == ("rita", "rita-renamed")
    # A new name that is another account's is not taken: the old one is kept, and audited.
    get_user_model().objects.create_user("rita-2", password="local-pass-1")
    sso.set_users({}, renames={"rita-renamed": "rita-2"})
    _, answer = sign_in(live_server.url, "rita-2")
    assert answer.status_code == 200
    user.refresh_from_db()
    assert user.username == "rita-renamed"
    refused = _events("sso_user_rename")[-1]
    assert refused.outcome == AuditEvent.DENIED and "rita-2" in refused.reason
    sso.set_users({}, renames={"rita-2": "rita"})


@pytest.mark.parametrize("lookalike", ["\u0430lice", "ALICE", "a1ice"])
def test_a_first_login_whose_name_looks_like_another_account_is_refused(
    live_server, sso, lookalike
):
    get_user_model().objects.create_user("alice", password="local-pass-1")
    sso.set_users({lookalike: ["payments-ops"]})
    _, answer = sign_in(live_server.url, lookalike)
    assert answer.status_code == 403 and "looks like" in answer.text, answer.text[:300]
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["alice"]
    refused = _events("sso_login_refused")[-1]
    assert "alice" in refused.reason and refused.context["subject"]


def test_a_name_bound_to_another_subject_is_not_taken_over(live_server, sso):
    other = get_user_model().objects.create_user("carol")
    other.set_unusable_password()
    other.save()
    SsoIdentity.objects.create(issuer=f"{sso.url}/o", subject="someone-else", user=other)
    sso.set_users({"carol": ["payments-ops"]})
    _, answer = sign_in(live_server.url, "carol")
    assert answer.status_code == 403 and "another person" in answer.text
    assert not roles_of(other)


def test_an_idp_user_made_before_binding_is_bound_once(live_server, sso):
    legacy = get_user_model().objects.create_user("ana")
    legacy.set_unusable_password()
    legacy.save()
    sign_in(live_server.url, "ana")
    assert SsoIdentity.objects.get().user == legacy
    assert _events("sso_identity_bind")[-1].object_id == str(legacy.pk)


def test_two_first_logins_of_one_person_at_once_make_one_account(monkeypatch, settings):
    """Two real PostgreSQL connections (one per thread) run the first login of one subject at once;
    the look-alike check is slowed so both are inside the window together."""
    settings.OIDC_GROUP_ROLES = {"payments-ops": ["operator"]}
    check = sso_rules.lookalike_of
    inside = threading.Barrier(2, timeout=5)

    def slow_check(name, **kwargs):
        try:
            inside.wait(timeout=1)  # both get here only if nothing serializes them
        except threading.BrokenBarrierError:
            pass
        return check(name, **kwargs)

    monkeypatch.setattr(sso_rules, "lookalike_of", slow_check)
    start = threading.Barrier(2, timeout=5)
    results: list[object] = []

    def login():
        try:
            start.wait()
            claims = {"sub": "42", "preferred_username": "dave", "groups": ["payments-ops"]}
            user = sso_rules.sign_in_from_claims(
                claims=claims, request=None, issuer="https://idp.test", subject="42"
            )
            results.append(user.pk)
        except Exception as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=login) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(results) == 2 and all(isinstance(r, int) for r in results), results
    assert results[0] == results[1]
    assert get_user_model().objects.filter(username="dave").count() == 1
    assert SsoIdentity.objects.filter(issuer="https://idp.test", subject="42").count() == 1
    assert len(_events("sso_user_create")) == 1


def test_the_session_is_refreshed_with_prompt_none_and_roles_follow_the_idp(
    live_server, sso, settings
):
    settings.OIDC_SESSION_REFRESH_S = 1
    sso.set_users({"ana": ["payments-ops"]})
    http, _ = sign_in(live_server.url, "ana")
    user = get_user_model().objects.get(username="ana")
    assert sorted(roles_of(user)) == ["operator"]
    logins = len(_events("login"))
    sso.set_users({"ana": ["secops"]})
    time.sleep(1.1)
    seen: list[str] = []
    http.hooks["response"].append(lambda r, *a, **k: seen.append(r.url))
    page = http.get(f"{live_server.url}/approvals/", timeout=20)
    assert page.status_code == 200 and page.url == f"{live_server.url}/approvals/", (
        seen,
        page.text[-800:],
    )
    assert any("prompt=none" in url for url in seen), seen  # went to the IdP and back
    assert sorted(roles_of(user)) == ["approver", "security_responder"]
    assert _events("sso_roles_change")[-1].context["removed"] == ["operator"]
    assert len(_events("login")) == logins  # a refresh is not a login
    # Groups that grant nothing now: the refresh ends the session.
    sso.set_users({"ana": ["marketing"]})
    time.sleep(1.1)
    assert http.get(f"{live_server.url}/", timeout=20).status_code == 403
    assert "/accounts/login/" in http.get(f"{live_server.url}/", timeout=10).url
    assert not roles_of(user)


@pytest.mark.parametrize("configured", ["endpoint", "discovery"])
def test_logout_ends_the_idp_session_too(live_server, sso, settings, configured):
    if configured == "endpoint":
        settings.OIDC_OP_END_SESSION_ENDPOINT = f"{sso.url}/o/logout/"
    else:  # read from the IdP's discovery document
        settings.OIDC_OP_DISCOVERY_ENDPOINT = f"{sso.url}/o/.well-known/openid-configuration/"
    sso.set_users({"ana": ["payments-ops"]})
    http, _ = sign_in(live_server.url, "ana")
    answer = http.post(
        f"{live_server.url}/accounts/logout/",
        data={"csrfmiddlewaretoken": http.cookies.get("csrftoken")},
        headers={"Referer": live_server.url + "/"},
        timeout=20,
    )
    assert answer.url.startswith(f"{live_server.url}/accounts/login/"), answer.url
    assert any(r.url.startswith(f"{sso.url}/o/logout/") for r in answer.history)
    event = _events("sso_idp_logout")[-1]
    assert event.actor == "ana" and event.context["method"] == "oidc"
    assert event.context["endpoint"] == f"{sso.url}/o/logout/"
    assert _events("logout")
    # Signed out at the IdP as well: starting a login asks for the password again.
    again = http.get(f"{live_server.url}/oidc/authenticate/", timeout=20)
    assert again.url.startswith(f"{sso.url}/login/"), again.url
