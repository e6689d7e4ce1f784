"""Shared cast and helpers. The suite runs on PostgreSQL (make test / .ci/run set DATABASE_URL)."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

import pytest
from django.db import connection, connections


def pytest_configure(config):
    from django.conf import settings

    # Tests create users; the production hasher's cost buys nothing here.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Anchors a developer's `make run` left in var/ describe another database: the verify pages and
    # `audit_verify` check anchors whenever the sink has any, so tests start from an empty sink.
    import tempfile

    settings.ANCHOR_DIR = tempfile.mkdtemp(prefix="cp-test-anchors-")
    # No heartbeat frames between the frames an in-process socket test expects (core/live.py;
    # tests/console/test_live_heartbeat.py turns it on). Servers a test starts keep theirs.
    settings.LIVE_HEARTBEAT_S = 0
    if os.environ.get("CONTROLPLANE_REQUIRE_POSTGRES") == "1":
        if not settings.IS_POSTGRES:
            raise pytest.UsageError(
                "CONTROLPLANE_REQUIRE_POSTGRES=1 but DATABASE_URL is not PostgreSQL: refusing to fall back to SQLite"
            )


@contextmanager
def triggers_off(aliases):
    """Replica mode: PostgreSQL fires no ordinary trigger in this session (superuser only)."""
    pg = [connections[a] for a in aliases if connections[a].vendor == "postgresql"]
    for conn in pg:
        with conn.cursor() as cur:
            cur.execute("SET session_replication_role = replica")
    try:
        yield
    finally:
        for conn in pg:
            with conn.cursor() as cur:
                cur.execute("SET session_replication_role = DEFAULT")


#: Kept by the fast flush: what post_migrate would write back at once (nothing in the suite adds or
#: removes a content type or a permission).
_FLUSH_KEEPS = frozenset({"django_content_type", "auth_permission"})


def delete_what_was_written(alias: str = "default") -> None:
    """Empty every table a test wrote to: the same end state as Django's flush (every model table
    empty, content types and permissions as post_migrate makes them), without its cost. The flush
    TRUNCATEs all tables and re-runs post_migrate, 0.5-2.5 s a test on a loaded machine; one probe
    of which tables hold a row and a DELETE of those few takes milliseconds. Triggers are off
    (replica mode), so neither the append-only triggers nor the foreign keys' order get in the way."""
    from django.db import transaction

    conn = connections[alias]
    qn = conn.ops.quote_name
    tables = [
        t
        for t in conn.introspection.django_table_names(only_existing=True, include_views=False)
        if t not in _FLUSH_KEEPS
    ]
    seeded = _MIGRATED_ROWS.get(alias, {})
    with transaction.atomic(using=alias), conn.cursor() as cur:
        cur.execute(" UNION ALL ".join(f"(SELECT %s FROM {qn(t)} LIMIT 1)" for t in tables), tables)
        for table in {t for (t,) in cur.fetchall()} | seeded.keys():
            cur.execute(f"DELETE FROM {qn(table)}")
        for table, rows in seeded.items():
            cur.execute(
                f"INSERT INTO {qn(table)} SELECT * FROM json_populate_recordset(NULL::{qn(table)}, %s)",
                [rows],
            )


def _tables_with_rows(alias: str) -> dict[str, str]:
    """Each model table that holds rows (besides ``_FLUSH_KEEPS``), with its rows as JSON."""
    conn = connections[alias]
    qn = conn.ops.quote_name
    tables = [
        t
        for t in conn.introspection.django_table_names(only_existing=True, include_views=False)
        if t not in _FLUSH_KEEPS
    ]
    with conn.cursor() as cur:
        cur.execute(" UNION ALL ".join(f"(SELECT %s FROM {qn(t)} LIMIT 1)" for t in tables), tables)
        rows = {}
        for (table,) in cur.fetchall():
            cur.execute(f"SELECT json_agg(t)::text FROM {qn(table)} t")
            rows[table] = cur.fetchone()[0]
    return rows


#: What the migrations wrote besides content types and permissions (the six role groups of
#: runs/migrations/0003_seed_roles.py), read once the test database is set up. A transactional
#: test's teardown writes it back: every test starts from the migrated database, whichever tests ran
#: before it. pytest-django runs the plain ``db`` tests before the transactional ones, which hid
#: this in one process; xdist hands a worker files in another order, and ``seed_demo`` then met a
#: database without roles (docs/operations/tests.md).
_MIGRATED_ROWS: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    if connection.vendor == "postgresql":
        with django_db_blocker.unblock():
            _MIGRATED_ROWS["default"] = _tables_with_rows("default")


@pytest.fixture(scope="session", autouse=True)
def _flush_past_append_only_triggers():
    """``django_db(transaction=True)`` tests end with a flush, which TRUNCATEs every table; the audit
    and history tables refuse TRUNCATE (audit/triggers.py). The flush is the test harness resetting
    its scratch database, not an application write, so it runs with triggers off -- and on
    PostgreSQL as a DELETE of the tables that hold rows (``delete_what_was_written``)."""
    from django.test import TransactionTestCase

    original = TransactionTestCase._fixture_teardown

    def teardown(self):
        aliases = self._databases_names(include_mirrors=False)
        with triggers_off(aliases):
            plain = self.available_apps is None and not self.serialized_rollback
            if plain and all(connections[a].vendor == "postgresql" for a in aliases):
                for alias in aliases:
                    delete_what_was_written(alias)
            else:
                original(self)

    TransactionTestCase._fixture_teardown = teardown
    yield
    TransactionTestCase._fixture_teardown = original


@pytest.fixture
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (run via make test)")


class Api:
    """A JSON client for /api/v1 acting with one bearer token (or a logged-in session)."""

    def __init__(self, client, token: str | None = None):
        self.client = client
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def post(self, path: str, body: dict | None = None, **extra):
        return self.client.post(
            f"/api/v1{path}",
            data=json.dumps(body or {}),
            content_type="application/json",
            **self.headers,
            **extra,
        )

    def get(self, path: str, **params):
        return self.client.get(f"/api/v1{path}", params, **self.headers)


PURCHASING_SCOPES = [
    "inventory:*",
    "shipping:*",
    "payments:charge",
    "payments:refund",
    "notifications:*",
    "address:verify",
]


@pytest.fixture
def agent(db):
    from runs.models import Agent

    return Agent.objects.create(name="purchasing", allowed_scopes=PURCHASING_SCOPES)


@pytest.fixture
def worker_token(agent):
    from runs.models import ApiToken

    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="worker-1", agents=["purchasing"])
    return secret


@pytest.fixture
def worker(client, worker_token):
    return Api(client, worker_token)


ROLE_USERS = {
    "vera": "viewer",
    "otto": "operator",
    "olga": "operator",
    "april": "approver",
    "ian": "incident_commander",
    "sam": "security_responder",
    "ada": "admin",
}


@pytest.fixture
def cast(db):
    """A fixed cast: vera viewer, otto & olga operators, april approver, ian incident commander,
    sam security responder, ada admin. Returns {username: (user, token)}."""
    from django.contrib.auth.models import Group, User

    from runs.models import ApiToken

    people = {}
    for username, role in ROLE_USERS.items():
        user = User.objects.create_user(username, password="pw-" + username)
        user.groups.add(Group.objects.get_or_create(name=role)[0])
        _, secret = ApiToken.issue(kind=ApiToken.OPERATOR, name=f"{username}-token", user=user)
        people[username] = (user, secret)
    return people


@pytest.fixture
def as_user(client, cast):
    def make(username: str) -> Api:
        from django.test import Client

        return Api(Client(), cast[username][1])

    return make


def start_run(api: Api, **overrides) -> dict:
    body = {
        "agent": "purchasing",
        "goal": "buy 2 of sku-1",
        "input": {"sku": "sku-1", "qty": 2},
        "versions": {
            "code": "1.0.0",
            "model": "m-1",
            "tools": {"payments": "3.1"},
            "config_hash": "abc",
        },
        "authority": [
            {"scope": "inventory:*", "ttl_s": 3600},
            {"scope": "payments:charge", "ttl_s": 3600},
        ],
    }
    body.update(overrides)
    resp = api.post("/runs", body)
    assert resp.status_code == 201, resp.content
    return resp.json()


def claim(api: Api, run_id: str, worker_name: str = "worker-7") -> dict:
    resp = api.post(f"/runs/{run_id}/claim", {"worker": worker_name})
    assert resp.status_code == 200, resp.content
    return resp.json()


def declare(api: Api, run_id: str, token: int, key: str = "order-42-charge", **overrides):
    body = {
        "fencing_token": token,
        "step": "charge",
        "tool": "payments",
        "action": "charge",
        "idempotency_key": key,
        "args": {"amount": 100},
        "compensation": {"tool": "payments", "action": "refund"},
    }
    body.update(overrides)
    return api.post(f"/runs/{run_id}/effects", body)


def committed_with_next(token: int, next_key: str) -> dict:
    """An outcome body: committed, with a checkpoint, carrying the next declaration (a charge)."""
    return {
        "fencing_token": token,
        "status": "committed",
        "checkpoint": {"step": "s0", "state": {"i": 0}},
        "next": {
            "fencing_token": token,
            "step": "charge",
            "tool": "payments",
            "action": "charge",
            "idempotency_key": next_key,
            "args": {"amount": 101},
        },
    }


def place_run_in(run_id, state: str) -> None:
    """Test scaffolding: put a run straight into ``state``, past the database's transition trigger
    (which refuses any edge the state table does not have -- tests that walk the table use this to
    start from every state)."""
    import pgtrigger

    from runs.models import Run

    with pgtrigger.ignore("runs.Run:run_state_transitions"):
        Run.objects.filter(pk=run_id).update(state=state)
