"""The production role split, proved on PostgreSQL: a throwaway application role gets the grants
``db_grants`` applies, a real connection logs in as it, and the server refuses UPDATE, DELETE and
TRUNCATE of audit and history rows by permission (before any trigger), and any DDL."""

from __future__ import annotations

import io
import uuid

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tests.conftest import claim, start_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres_only")]

APPEND_ONLY = ("audit_auditevent", "runs_historyevent")


@pytest.fixture
def app_role():
    """A login role of our own (roles are cluster-wide: the name is unique to this test run)."""
    name = f"cp_test_app_{uuid.uuid4().hex[:10]}"
    with connection.cursor() as cur:
        cur.execute(f"CREATE ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    yield name
    with connection.cursor() as cur:
        cur.execute(f"DROP OWNED BY {name}")
        cur.execute(f"DROP ROLE {name}")


@pytest.fixture
def as_role(app_role):
    settings = connection.settings_dict
    conn = psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        dbname=settings["NAME"],
        user=app_role,
        autocommit=True,
    )
    yield conn
    conn.close()


def _refused(conn, sql: str) -> str:
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        conn.execute(sql)
    return str(refused.value)


def test_db_grants_prints_insert_and_select_only_for_audit_and_history():
    out = io.StringIO()
    call_command("db_grants", "--app-role", "cp_app", stdout=out)
    sql = out.getvalue()
    for table in APPEND_ONLY:
        assert f'GRANT SELECT, INSERT ON "{table}" TO "cp_app";' in sql
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON "runs_run" TO "cp_app";' in sql
    assert "TRUNCATE" not in sql and sql.startswith("-- as the owner role")
    with pytest.raises(CommandError, match="--app-role"):
        call_command("db_grants", "--app-role", "app; DROP TABLE runs_run")


def test_the_application_role_cannot_rewrite_audit_or_history(worker, app_role, as_role):
    run = start_run(worker)
    claim(worker, run["id"])
    call_command("db_grants", "--app-role", app_role, "--apply", stderr=io.StringIO())

    for table in APPEND_ONLY:
        rows = as_role.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert rows > 0
        for sql in (f"UPDATE {table} SET hash = hash", f"DELETE FROM {table}", f"TRUNCATE {table}"):
            assert f"permission denied for table {table}" in _refused(as_role, sql)
        assert "must be owner" in _refused(as_role, f"ALTER TABLE {table} DISABLE TRIGGER ALL")
        with connection.cursor() as cur:  # nothing moved
            cur.execute(f"SELECT count(*) FROM {table}")
            assert cur.fetchone()[0] == rows

    # What the application does need still works: append to the chain, move its head, update a run.
    as_role.execute(
        "INSERT INTO audit_auditevent (seq, chain, chain_seq, event_id, created_at, actor_kind, actor,"
        " role, on_behalf_of, action, object_type, object_id, reason, outcome, component, source_ip,"
        " user_agent, request_id, context, prev_hash, hash) VALUES (nextval('audit_event_order'),"
        " 'grants-test', 1, gen_random_uuid(), now(), 'system', 'grants-test',"
        " '', '', 'test.insert', 'test', 'x', '', 'allowed', 'test', '', '', '', '{}', 'p', 'h')"
    )
    as_role.execute("UPDATE audit_auditchain SET seq = seq")
    as_role.execute("UPDATE runs_run SET updated_at = now()")
    # No TRUNCATE anywhere, and no DDL.
    assert "permission denied" in _refused(as_role, "TRUNCATE runs_effect")
    assert "permission denied for schema" in _refused(as_role, "CREATE TABLE sneaky (i int)")
