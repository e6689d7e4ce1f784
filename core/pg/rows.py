"""Equality lookups on the worker protocol's hot path, without Django's query compiler.

Every protocol call locks its run and reads a few rows by equality (the lease by fencing token, an
effect by idempotency key, the run's grants, the latest approval for an action). Compiling those
querysets cost more CPU than PostgreSQL spent answering them. ``select_rows`` builds the same
``SELECT <every column> … WHERE a = %s AND b = %s [ORDER BY …] [LIMIT n] [FOR NO KEY UPDATE]`` once
per shape, caches the
text, prepares each value with its field's ``get_db_prep_value`` (what the ORM does: a UUID becomes
hex on SQLite, for instance), applies the converters the ORM's compiler would apply to each column,
and builds instances with ``Model.from_db``, so they behave like any other instance (lazy relations,
``save``, ``refresh_from_db``).

Only for equality filters on concrete columns; anything richer stays with the ORM.

Measured (docs/benchmarks.md): of ~35 ms server CPU per effect, ~12.6 ms was the ORM and psycopg
driving ~32 statements, each its own round trip; ``write_rows`` makes a decision's whole write one
statement. The twins (``core.pg.enabled`` false: the SQLite demo) are the plain ORM calls, and
``tests/core/pg/test_rows.py`` holds both to the same rows on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from django.core.exceptions import FieldError, ValidationError
from django.db import connections, models, router
from django.db.models.fields.related import RelatedField

from core import pg

M = TypeVar("M", bound=models.Model)


def hot_cursor(conn: Any) -> Any:
    """``conn.cursor()`` for the hot path's statements. On PostgreSQL: a server-binding cursor that
    prepares each statement on its first execution on this connection (psycopg's ``prepare=True``),
    so PostgreSQL parses and plans each of them once per connection instead of on every call (Django
    binds client-side and prepares nothing by default). Still wrapped by Django (execute wrappers,
    query logging, error translation). Prepared statements live in the server session: put no
    transaction-mode pooler (PgBouncer) between the app and PostgreSQL."""
    if not pg.enabled(conn):
        return conn.cursor()
    conn.ensure_connection()
    raw = conn.connection
    if raw.prepare_threshold is None:  # Django's "never": only prepare=True statements, then
        raw.prepare_threshold = _ONLY_WHEN_ASKED  # (its own cursors bind client-side: never)
    with conn.wrap_database_errors:
        return conn._prepare_cursor(_prepared_cursor_class()(raw))


_ONLY_WHEN_ASKED = 2**31 - 1


# psycopg converts a statement's ``%s`` placeholders to ``$n`` on every execute, and caches the
# result only for statements of at most 50 parameters and 4096 bytes (against ORMs' ever-varying
# multi-row INSERTs). The hot path's statements are a small, fixed set of shapes (``write_rows``'s
# CTEs have 60-100 parameters), so psycopg re-scanned them on every call: 8.5 % of the API process's
# GIL time in session 28's profile. Converted once per statement text here, for this cursor only.
CONVERTED_STATEMENTS_MAX = 256
_converted: dict[tuple[str, str], tuple] = {}


@lru_cache(maxsize=1)
def _query_class() -> type:
    from psycopg._queries import PostgresQuery, _query2pg_nocache

    class ConvertedOnceQuery(PostgresQuery):
        __slots__ = ()

        def convert(self, query, vars):
            if vars is None or type(query) is not str:
                return super().convert(query, vars)
            encoding = self._tx.encoding
            key = (query, encoding)
            converted = _converted.get(key)
            if converted is None:
                if len(_converted) >= CONVERTED_STATEMENTS_MAX:
                    _converted.clear()  # a bound, never reached by the hot path's shapes
                converted = _query2pg_nocache(query.encode(encoding), encoding)
                _converted[key] = converted
            self.query, self._want_formats, self._order, self._parts = converted
            self.dump(vars)

    return ConvertedOnceQuery


@lru_cache(maxsize=1)
def _prepared_cursor_class() -> type:
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):
        _query_cls = _query_class()

        def execute(self, query, params=None, *, prepare=None, binary=None):
            return super().execute(query, params, prepare=True, binary=binary)

    return PreparedCursor


def _column(field: models.Field | models.ForeignObjectRel) -> str:
    """The column a field is stored in; a reverse relation (or a field without a column) has none."""
    column = None if isinstance(field, models.ForeignObjectRel) else field.column
    if column is None:
        raise FieldError(f"{field} has no column: rows only compares concrete columns")
    return column


@lru_cache(maxsize=64)
def _shape(model: type[models.Model], alias: str) -> tuple[str, tuple[str, ...], tuple]:
    """The SELECT list (every concrete column, in ``from_db`` order), the attnames, and per column the
    converters the ORM's compiler would apply (backend's, then the column's: JSON decoding, SQLite's
    UUIDs and datetimes…). ``Model.objects.raw`` would work these out again on every query. Cached per
    alias, not per connection object: converters only read settings-level state (the time zone), and
    every thread's connection to an alias has the same."""
    conn = connections[alias]
    meta = model._meta
    qn = conn.ops.quote_name
    converters = []
    for field in meta.concrete_fields:
        col = field.get_col(meta.db_table)
        found = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
        converters.append((tuple(found), col) if found else None)
    select = ", ".join(qn(_column(field)) for field in meta.concrete_fields)
    return select, tuple(field.attname for field in meta.concrete_fields), tuple(converters)


@lru_cache(maxsize=256)
def _statement(
    model: type[models.Model],
    columns: tuple[str, ...],
    order_by: tuple[str, ...],
    limit: int | None,
    lock: bool,
    alias: str,
) -> str:
    conn = connections[alias]
    qn = conn.ops.quote_name
    meta = model._meta
    where = " AND ".join(f"{qn(_column(meta.get_field(name)))} = %s" for name in columns)
    sql = f"SELECT {_shape(model, alias)[0]} FROM {qn(meta.db_table)} WHERE {where}"
    if order_by:
        sql += " ORDER BY " + ", ".join(
            f"{qn(_column(meta.get_field(name.lstrip('-'))))} {'DESC' if name.startswith('-') else 'ASC'}"
            for name in order_by
        )
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    if lock and conn.features.has_select_for_update:  # SQLite has none: its writers are serialised
        # NO KEY UPDATE: decisions on one row still queue behind each other, but a foreign-key check
        # (KEY SHARE, taken at COMMIT for Django's deferred constraints) is not blocked by it. With
        # FOR UPDATE, a child run's decision committing a row that references its parent deadlocked
        # with a tree cancel that held the parent and waited for the child (seen in the acceptance
        # suite). We never change a primary key, so nothing needs the stronger lock.
        no_key = conn.features.has_select_for_no_key_update
        sql += " FOR NO KEY UPDATE" if no_key else " FOR UPDATE"
    return sql


def select_rows[M: models.Model](
    model: type[M],
    *,
    order_by: tuple[str, ...] = (),
    limit: int | None = None,
    lock: bool = False,
    **equals: Any,
) -> list[M]:
    """``model.objects.filter(**equals).order_by(*order_by)[:limit]`` (``.select_for_update()`` with
    ``lock``), as cached hand-written SQL. Field names, not ``__`` lookups; ``pk`` means the primary key.
    A value its field cannot hold (a malformed UUID, say) matches no row, as it would in the database."""
    alias = router.db_for_write(model) if lock else router.db_for_read(model)
    conn = connections[alias]
    meta = model._meta
    names = tuple(meta.pk.name if name == "pk" else name for name in equals)
    params = []
    for name, value in zip(names, equals.values(), strict=False):
        field = meta.get_field(name)
        relation = (RelatedField, models.ForeignObjectRel)  # the fields whose is_relation is true
        target = field.target_field if isinstance(field, relation) else field
        if isinstance(value, models.Model):
            value = value.pk
        try:
            params.append(target.get_db_prep_value(value, conn))
        except (ValidationError, ValueError, TypeError):
            return []
    sql = _statement(model, names, tuple(order_by), limit, lock, alias)
    _, attnames, converters = _shape(model, alias)
    with hot_cursor(conn) as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    found = []
    for row in fetched:
        values = list(row)
        for i, conv in enumerate(converters):
            if conv is not None:
                funcs, col = conv
                for func in funcs:
                    values[i] = func(values[i], col, conn)
        found.append(model.from_db(alias, attnames, values))
    return found


def select_row[M: models.Model](
    model: type[M], *, order_by: tuple[str, ...] = (), lock: bool = False, **equals: Any
) -> M | None:
    """The first row of ``select_rows(…, limit=1)``, or None."""
    rows = select_rows(model, order_by=order_by, limit=1, lock=lock, **equals)
    return rows[0] if rows else None


# --- several rows read as JSON in one statement, several writes in one statement -------------------


def from_json[M: models.Model](model: type[M], data: dict[str, Any] | None) -> M | None:
    """An instance from ``row_to_json(t)`` of ``model``'s table (keys are column names), as the ORM
    would have loaded it: each value goes through its field's ``to_python`` (ISO text to datetime, text
    to UUID; JSON columns arrive decoded). Lets one statement bring back rows of several tables."""
    if data is None:
        return None
    meta = model._meta
    values = [field.to_python(data[_column(field)]) for field in meta.concrete_fields]
    alias = router.db_for_read(model)
    return model.from_db(alias, [field.attname for field in meta.concrete_fields], values)


@lru_cache(maxsize=64)
def _insert_shape(model: type[models.Model], alias: str) -> tuple[str, tuple, models.Field | None]:
    """``INSERT INTO t (cols) VALUES (%s, …)`` for a new instance (what ``save(force_insert=True)``
    sends), the fields in column order, and the auto primary key to return if the model has one."""
    qn = connections[alias].ops.quote_name
    meta = model._meta
    auto = meta.auto_field
    fields = tuple(f for f in meta.local_concrete_fields if f is not auto and not f.generated)
    columns = ", ".join(qn(_column(f)) for f in fields)
    values = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES ({values})"
    if auto is not None:
        sql += f" RETURNING {qn(_column(auto))}"
    return sql, fields, auto


@dataclass
class Extra:
    """More of a decision's write in ``write_rows``' one statement: CTEs of its own (``parts(prefix)``
    gives their text, their parameters, and SELECT expressions with their parameters, named under
    ``prefix`` so several extras never collide), ``done`` takes the selected values; ``fallback`` does
    the same work on its own, whatever the database: what runs where there are no data-modifying CTEs
    (the SQLite demo) or nothing else to write."""

    parts: Callable[[str], tuple[list[str], list[Any], list[str], list[Any]]]
    done: Callable[[list[Any]], None]
    fallback: Callable[[], None]


def write_rows(
    inserts: list[models.Model],
    updates: list[tuple[type[models.Model], Any, dict[str, Any]]] = (),  # type: ignore[assignment]
    extras: list[Extra] = (),  # type: ignore[assignment]
) -> None:
    """``obj.save(force_insert=True)`` for each of ``inserts`` and
    ``Model.objects.filter(pk=pk).update(**values)`` for each of ``updates``, in ONE statement on
    PostgreSQL (a data-modifying CTE: one round trip for a decision's whole write). Values are prepared
    by each field's ``get_db_prep_save``, as the ORM does; auto primary keys are set on the instances.
    Every UPDATE must hit exactly one row (the caller holds its lock), else RuntimeError. ``extras``
    join the same statement (an audit append, a NOTIFY: see ``Extra``). Elsewhere (the SQLite demo)
    the ORM calls run one by one, then each extra's fallback. No signals are sent (none are connected
    to these models). Only plain values: no expressions."""
    if not inserts and not updates:
        for extra in extras:
            extra.fallback()
        return
    model = type(inserts[0]) if inserts else updates[0][0]
    alias = router.db_for_write(model)
    conn = connections[alias]
    if not pg.enabled(conn):
        for obj in inserts:
            obj.save(force_insert=True, using=alias)
        for update_model, pk, values in updates:
            if update_model._base_manager.using(alias).filter(pk=pk).update(**values) != 1:
                raise RuntimeError(f"{update_model.__name__} {pk} was not updated")
        for extra in extras:
            extra.fallback()
        return
    qn = conn.ops.quote_name
    parts: list[str] = []
    params: list[Any] = []
    selects: list[str] = []
    autos: list[tuple[models.Model, models.Field]] = []
    for i, obj in enumerate(inserts):
        sql, fields, auto = _insert_shape(type(obj), alias)
        if auto is None:
            sql += " RETURNING 1"
        parts.append(f"i{i} AS ({sql})")
        params.extend(f.get_db_prep_save(f.pre_save(obj, True), connection=conn) for f in fields)
        if auto is not None:
            autos.append((obj, auto))
            selects.append(f"(SELECT {qn(_column(auto))} FROM i{i})")
        else:
            selects.append(f"(SELECT count(*) FROM i{i})")
    for j, (update_model, pk, values) in enumerate(updates):
        meta = update_model._meta
        sets = []
        for name, value in values.items():
            field = meta.get_field(name)
            assert isinstance(field, models.Field), f"{name} is not a column of {meta.label}"
            if isinstance(value, models.Model):
                value = value.pk
            sets.append(f"{qn(_column(field))} = %s")
            params.append(field.get_db_prep_save(value, connection=conn))
        parts.append(
            f"u{j} AS (UPDATE {qn(meta.db_table)} SET {', '.join(sets)} "
            f"WHERE {qn(_column(meta.pk))} = %s RETURNING 1)"
        )
        params.append(meta.pk.get_db_prep_value(pk, conn))
        selects.append(f"(SELECT count(*) FROM u{j})")
    select_params: list[Any] = []
    spans = []
    for k, extra in enumerate(extras):
        ctes, cte_params, extra_selects, extra_select_params = extra.parts(f"x{k}")
        parts.extend(ctes)
        params.extend(cte_params)
        spans.append(len(extra_selects))
        selects.extend(extra_selects)
        select_params.extend(extra_select_params)
    statement = f"WITH {', '.join(parts)} SELECT {', '.join(selects)}"
    with hot_cursor(conn) as cursor:
        cursor.execute(statement, params + select_params)
        row = cursor.fetchone()
    found = list(row)
    if extras:
        tail = found[len(found) - sum(spans) :]
        del found[len(found) - sum(spans) :]
        for extra, span in zip(extras, spans, strict=True):
            extra.done(tail[:span])
            del tail[:span]
    for obj in inserts:
        value = found.pop(0)
        auto = obj._meta.auto_field
        if auto is not None:
            setattr(obj, auto.attname, value)
        obj._state.adding, obj._state.db = False, alias
    for update_model, pk, _ in updates:
        if found.pop(0) != 1:
            raise RuntimeError(f"{update_model.__name__} {pk} was not updated")
