"""Seed the test IdP: one client for the controlplane, users with groups, renames. argv: a JSON spec."""

import json
import sys

import django

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402

spec = json.loads(sys.argv[1])
for old, new in spec.get("renames", {}).items():  # the same person (subject = pk), a new name
    User.objects.filter(username=old).update(username=new)
for name, groups in spec["users"].items():
    user = User.objects.filter(username=name).first() or User.objects.create_user(
        name, email=f"{name}@example.test", password="idp-pass-1"
    )
    user.groups.set([Group.objects.get_or_create(name=g)[0] for g in groups])
Application.objects.filter(client_id="controlplane").delete()
Application.objects.create(
    name="controlplane",
    client_id="controlplane",
    client_secret="cp-secret",
    hash_client_secret=False,
    client_type=Application.CLIENT_CONFIDENTIAL,
    authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
    redirect_uris=spec["redirect_uri"],
    post_logout_redirect_uris=spec["redirect_uri"].replace("/oidc/callback/", "/accounts/login/"),
    algorithm=Application.RS256_ALGORITHM,
    skip_authorization=True,
)
