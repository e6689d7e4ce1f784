"""One round trip for a chain append.

Appending to a hash chain is always two writes: INSERT the new link, then UPDATE the row that records
the chain's head (the run's ``history_seq``/``history_head``).
On PostgreSQL both go to the server as one statement (a data-modifying CTE), which saves a round trip
on every decision of the worker protocol. The SQL of both parts is compiled by Django's own INSERT and
UPDATE compilers, so the values written are exactly those ``obj.save(force_insert=True)`` and
``Model.objects.filter(pk=…).update(**values)`` would write; the caller still holds its locks and is
inside its transaction. Other databases (the SQLite demo) run the two ORM calls as before.

Measured (docs/benchmarks.md): every decision of the worker protocol appends history, and each round
trip was one of the ~32 statements per effect that cost ~12.6 ms of its ~35 ms server CPU;
``tests/core/pg/test_append.py`` holds the statement to the two ORM calls on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, router
from django.db.models import Model, sql

from core import pg


def insert_and_update(
    obj: Model, update_model: type[Model], update_pk: Any, values: dict[str, Any]
) -> None:
    """``obj.save(force_insert=True)`` and ``update_model.objects.filter(pk=update_pk).update(**values)``
    in one statement. Sets ``obj``'s auto primary key like ``save`` does. The UPDATE must hit one row."""
    model = type(obj)
    using = router.db_for_write(model, instance=obj)
    connection = connections[using]
    if not pg.enabled(connection):
        obj.save(force_insert=True, using=using)
        update_model._base_manager.using(using).filter(pk=update_pk).update(**values)
        return
    meta = obj._meta
    auto = meta.auto_field
    assert auto is not None and auto.column, f"{model.__name__} has no auto primary key to return"
    # The columns Model.save() inserts for a new row whose auto primary key is not set.
    fields = [f for f in meta.local_concrete_fields if f is not auto and not f.generated]
    insert = sql.InsertQuery(model)
    insert.insert_values(fields, [obj])
    insert_compiler = insert.get_compiler(using=using)
    insert_compiler.returning_fields = [auto]
    ((insert_sql, insert_params),) = insert_compiler.as_sql()

    update = (
        update_model._base_manager.using(using).filter(pk=update_pk).query.chain(sql.UpdateQuery)
    )
    assert isinstance(update, sql.UpdateQuery)  # chain(klass) returns a klass; the stubs say Query
    update.add_update_values(values)
    update_sql, update_params = update.get_compiler(using=using).as_sql()

    qn = connection.ops.quote_name
    statement = (
        f"WITH ins AS ({insert_sql}), upd AS ({update_sql} RETURNING 1) "
        f"SELECT (SELECT {qn(auto.column)} FROM ins), (SELECT count(*) FROM upd)"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, (*insert_params, *update_params))
        pk, updated = cursor.fetchone()
    if (
        updated != 1
    ):  # the head row must exist (callers hold its lock): never write a link without it
        raise RuntimeError(f"{update_model.__name__} {update_pk} was not updated ({updated} rows)")
    setattr(obj, auto.attname, pk)
    obj._state.adding = False
    obj._state.db = using
