"""Appending one audit event to its chain: one statement, no global lock.

On PostgreSQL the event's INSERT and its chain head's move are one statement: an upsert of the head
(``INSERT … ON CONFLICT (key) DO UPDATE``, which creates a chain on its first event and otherwise locks
only that chain's head row) computes the new position and the new hash in SQL, and RETURNING feeds
them to the INSERT of the event. The hash must be the one ``link_hash`` computes in Python (the verifier
recomputes it there), so Python renders the canonical bytes of every hashed field except the position,
split around where the position goes, and SQL hashes ``prev_hash + "\\n" + before + seq + after``:
canonical JSON has sorted keys and no whitespace, so the position is one integer between two fixed
strings. ``tests/audit/test_append.py`` checks the two agree.

The head row's lock is held until the deciding transaction commits, like every row that decision
writes: decisions on one run queue here (they already queue on the run row), decisions on different
runs do not. Other databases (the SQLite demo, whose writers are serialised anyway) run the same two
writes through the ORM.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.db import connections, router

from audit.models import SYSTEM, AuditChain, AuditEvent
from core import pg
from core.pg.rows import Extra, hot_cursor

from .hashing import GENESIS, canonical, link_hash

# Set by the append statement, not by the caller.
_DERIVED = ("id", "seq", "chain_seq", "prev_hash", "hash")


def chain_for(run_id: Any) -> str:
    """A run's events go to the run's chain; everything else to the low-volume system chain."""
    return f"run:{run_id}" if run_id else SYSTEM


def split_payload(fields: dict[str, Any]) -> tuple[str, str]:
    """The canonical JSON of ``fields`` (which must include ``seq``) as the text before and after the
    value of ``seq``: ``canonical(fields) == before + str(seq) + after``."""
    before = {k: v for k, v in fields.items() if k < "seq"}
    after = {k: v for k, v in fields.items() if k > "seq"}
    head = canonical(before)[:-1].decode()  # '{…' without its closing brace
    tail = canonical(after)[1:].decode()  # '…}' without its opening brace
    return (head + ("," if before else "") + '"seq":'), (("," if after else "") + tail)


@lru_cache(maxsize=4)
def _pieces(alias: str) -> tuple[str, str, tuple[str, ...]]:
    """The head's upsert and the event's INSERT (which reads the upsert's RETURNING from the CTE
    named ``{head}``), and the event columns the INSERT's parameters fill, in order."""
    qn = connections[alias].ops.quote_name
    meta = AuditEvent._meta
    fields = [f for f in meta.concrete_fields if f.attname not in _DERIVED]
    columns = tuple(f.attname for f in fields)
    cols = ", ".join(qn(str(f.column)) for f in fields)
    values = ", ".join(["%s"] * len(columns))
    head = qn(AuditChain._meta.db_table)
    new_hash = (
        "encode(sha256(convert_to({prev} || E'\\n' || %s || ({seq})::text || %s, 'UTF8')), 'hex')"
    )
    upsert = (
        f"INSERT INTO {head} AS h (key, seq, hash, prev_hash, updated_at, xid) "
        f"VALUES (%s, 1, {new_hash.format(prev='%s', seq='1')}, %s, %s, pg_current_xact_id()) "
        f"ON CONFLICT (key) DO UPDATE SET seq = h.seq + 1, prev_hash = h.hash, "
        f"hash = {new_hash.format(prev='h.hash', seq='h.seq + 1')}, "
        f"updated_at = EXCLUDED.updated_at, xid = EXCLUDED.xid "
        f"RETURNING h.seq, h.prev_hash, h.hash"
    )
    insert = (
        f"INSERT INTO {qn(meta.db_table)} (seq, chain_seq, prev_hash, hash, {cols}) "
        f"SELECT nextval('audit_event_order'), {{head}}.seq, {{head}}.prev_hash, {{head}}.hash, "
        f"{values} FROM {{head}} RETURNING id, seq, chain_seq, prev_hash, hash"
    )
    return upsert, insert, columns


@lru_cache(maxsize=4)
def _statement(alias: str) -> tuple[str, tuple[str, ...]]:
    upsert, insert, columns = _pieces(alias)
    return f"WITH head AS ({upsert}) {insert.format(head='head')}", columns


def _params(event: AuditEvent, connection, columns: tuple[str, ...]) -> list[Any]:
    before, after = split_payload(event.hashed_fields() | {"seq": 0})
    fields = {f.attname: f for f in AuditEvent._meta.concrete_fields}
    values = [fields[name].get_db_prep_save(getattr(event, name), connection) for name in columns]
    return [event.chain, GENESIS, before, after, GENESIS, event.created_at, before, after, *values]


def _filled(event: AuditEvent, using: str, found: Any) -> AuditEvent:
    event.pk, event.seq, event.chain_seq, event.prev_hash, event.hash = found
    event._state.adding, event._state.db = False, using
    return event


def appending(event: AuditEvent) -> Extra:
    """``append(event)`` as part of a decision's one write statement (``core.pg.rows.write_rows``): the
    head's upsert and the event's INSERT become two more CTEs of it, on PostgreSQL; elsewhere (and
    alone) it is ``append``."""
    using = router.db_for_write(AuditEvent, instance=event)

    def parts(prefix: str) -> tuple[list[str], list[Any], list[str], list[Any]]:
        upsert, insert, columns = _pieces(using)
        ctes = [f"{prefix}h AS ({upsert})", f"{prefix} AS ({insert.format(head=prefix + 'h')})"]
        returned = ("id", "seq", "chain_seq", "prev_hash", "hash")
        selects = [f"(SELECT {col} FROM {prefix})" for col in returned]
        return ctes, _params(event, connections[using], columns), selects, []

    def done(found: list[Any]) -> None:
        _filled(event, using, found)

    def fallback() -> None:
        append(event)

    return Extra(parts=parts, done=done, fallback=fallback)


def append(event: AuditEvent) -> AuditEvent:
    """Write ``event`` (every field set but id, seq, chain_seq, prev_hash, hash) at the end of its chain
    and fill those in. Inside the caller's transaction."""
    using = router.db_for_write(AuditEvent, instance=event)
    connection = connections[using]
    if not pg.enabled(connection):
        return _append_orm(event, using)
    sql, columns = _statement(using)
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, _params(event, connection, columns))
        return _filled(event, using, cursor.fetchone())


def _append_orm(event: AuditEvent, using: str) -> AuditEvent:
    heads = AuditChain.objects.using(using).select_for_update()
    head, _ = heads.get_or_create(key=event.chain, defaults={"hash": GENESIS, "prev_hash": GENESIS})
    last = AuditEvent.objects.using(using).order_by("-seq").values_list("seq", flat=True).first()
    event.seq, event.chain_seq, event.prev_hash = (last or 0) + 1, head.seq + 1, head.hash
    event.hash = link_hash(event.prev_hash, event.hashed_fields())
    event.save(force_insert=True, using=using)
    AuditChain.objects.using(using).filter(key=event.chain).update(
        seq=event.chain_seq, hash=event.hash, prev_hash=event.prev_hash, updated_at=event.created_at
    )
    return event
