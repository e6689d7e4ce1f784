"""Append-only triggers, created by migrations on PostgreSQL only (SQLite demo has no triggers)."""

APPEND_ONLY_FUNCTION = """
CREATE OR REPLACE FUNCTION controlplane_append_only() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def protect(table: str) -> tuple[str, str]:
    forward = (
        APPEND_ONLY_FUNCTION
        + f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};"
        + f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
        + "FOR EACH ROW EXECUTE FUNCTION controlplane_append_only();"
    )
    backward = f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};"
    return forward, backward


def run_sql_on_postgres(sql: str):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(sql)  # no params: plpgsql's own % placeholders must reach the server

    return apply
