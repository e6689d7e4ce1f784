from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from audit.grants import grant_statements
from audit.registry import append_only_tables
from core import pg


class Command(BaseCommand):
    help = (
        "Print (or --apply, as the owner role) the grants of the application role: INSERT and SELECT "
        "only on the append-only audit and history tables, no TRUNCATE anywhere, no DDL. Run again "
        "after every migration."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--app-role", required=True, help="the role the application connects as"
        )
        parser.add_argument("--apply", action="store_true", help="execute instead of printing")

    def handle(self, *args, app_role, apply, **opts):
        if not pg.enabled(connection):
            raise CommandError("db_grants is for PostgreSQL (the SQLite demo has no roles)")
        try:
            statements = grant_statements(app_role)
        except ValueError as exc:
            raise CommandError(f"--app-role: {exc}")
        if not apply:
            self.stdout.write(
                f"-- as the owner role (the one that runs migrations); append-only for {app_role}: "
                + ", ".join(append_only_tables())
            )
            self.stdout.write("BEGIN;")
            for statement in statements:
                self.stdout.write(statement + ";")
            self.stdout.write("COMMIT;")
            return
        with transaction.atomic(), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        self.stderr.write(f"applied {len(statements)} grant statements for role {app_role}")
