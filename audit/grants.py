"""The production database grants: an owner role migrates, the application role only reads and writes.

PostgreSQL checks privileges before any trigger runs, so an application role without UPDATE, DELETE and
TRUNCATE on the append-only tables is refused by the server itself, whatever happens to the triggers.
The owner of a table (and any superuser) can still do anything, including disable its triggers: that
is what the signed anchors (audit/anchors/) are for. Statements are built from the live schema, so run
them again after every migration (they are idempotent).
"""

from __future__ import annotations

import re

from django.db import connection

from .registry import append_only_tables

ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
READ_ONLY_TABLES = {"django_migrations"}  # the schema is the owner's business


def grant_statements(app_role: str) -> list[str]:
    if not ROLE_NAME.match(app_role):
        raise ValueError("role name: lower-case letters, digits and _ only, at most 63 characters")
    qn = connection.ops.quote_name
    role = qn(app_role)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        schema = qn(cursor.fetchone()[0])
        tables = sorted(connection.introspection.table_names(cursor))
    append_only = set(append_only_tables())
    statements = [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"REVOKE CREATE ON SCHEMA {schema} FROM {role}",
        # Start from nothing, so a grant given by hand earlier (TRUNCATE, TRIGGER, …) does not linger.
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role}",
    ]
    for table in tables:
        if table in append_only:
            privileges = "SELECT, INSERT"
        elif table in READ_ONLY_TABLES:
            privileges = "SELECT"
        else:
            privileges = "SELECT, INSERT, UPDATE, DELETE"
        statements.append(f"GRANT {privileges} ON {qn(table)} TO {role}")
    statements.append(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
    return statements
