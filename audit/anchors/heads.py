"""The database side of anchors: reading the chain heads to sign, and holding the chains to every head
the anchors signed (audit/anchors/verify.py checks the signatures)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import connection
from django.db.models import Max

from audit.chain.hashing import GENESIS
from audit.models import LEGACY, AuditChain, AuditEvent
from core import pg

from .merkle import Leaf, merkle_root

MAX_REPORTED = 20


# --- writing ---------------------------------------------------------------------------------------


def read_heads(previous: str | None) -> tuple[list[Leaf], list[Leaf], str | None]:
    """(every head, the heads that moved since the snapshot ``previous``, this snapshot). Inside the
    anchor's snapshot. On PostgreSQL a head moved if the transaction of its last append (``xid``) had
    not committed in ``previous``; elsewhere (SQLite) every head counts as moved."""
    if not pg.enabled(connection):
        leaves = [
            tuple(r) for r in AuditChain.objects.order_by("key").values_list("key", "seq", "hash")
        ]
        return leaves, leaves, None  # type: ignore[return-value]
    # A snapshot never lists its own transaction as in progress: heads this transaction moved (an
    # anchor written inside a caller's transaction, as in tests) count as moved too. A superset of the
    # moved heads is always safe: replaying it rebuilds the same full set.
    moved_sql = (
        "true"
        if previous is None
        else "(NOT pg_visible_in_snapshot(xid, %s::pg_snapshot) "
        "OR xid IS NOT DISTINCT FROM pg_current_xact_id_if_assigned())"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT key, seq, hash, {moved_sql} FROM audit_auditchain ORDER BY key",
            [] if previous is None else [previous],
        )
        rows = cursor.fetchall()
        cursor.execute("SELECT pg_current_snapshot()::text")
        (current,) = cursor.fetchone()
    every: list[Leaf] = [(k, s, h) for k, s, h, _ in rows]
    return every, [(k, s, h) for k, s, h, m in rows if m], current


def contradicted_heads(heads: list[Leaf]) -> list[str]:
    """Chains among ``heads`` whose head is not their last row: signing those would bless tampering."""
    wrong = []
    for i in range(0, len(heads), 500):
        chunk = heads[i : i + 500]
        found = _event_hashes([(k, s) for k, s, _ in chunk])
        tops = dict(
            AuditEvent.objects.filter(chain__in=[k for k, _, _ in chunk])
            .values_list("chain")
            .annotate(top=Max("chain_seq"))
        )
        wrong += [k for k, s, h in chunk if found.get((k, s)) != h or tops.get(k) != s]
    return wrong


def _event_hashes(keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """(chain, chain_seq) -> hash of the events at those positions, one query per 1000 positions."""
    stored: dict[tuple[str, int], str] = {}
    for i in range(0, len(keys), 1000):
        chunk = keys[i : i + 1000]
        if pg.enabled(connection):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT e.chain, e.chain_seq, e.hash FROM unnest(%s::text[], %s::bigint[]) "
                    "AS a(chain, seq) JOIN audit_auditevent e "
                    "ON e.chain = a.chain AND e.chain_seq = a.seq",
                    [[k for k, _ in chunk], [s for _, s in chunk]],
                )
                stored.update({(c, s): h for c, s, h in cursor.fetchall()})
        else:
            for chain, seq in chunk:
                found = AuditEvent.objects.filter(chain=chain, chain_seq=seq).values_list(
                    "hash", flat=True
                )
                if found:
                    stored[(chain, seq)] = found[0]
    return stored


# --- verifying -------------------------------------------------------------------------------------


def first_mismatch(
    anchors: list[tuple[int, dict[str, Any]]], report: dict[str, Any]
) -> dict[str, Any]:
    """Replay the anchors in sink order and hold the database to every head they signed.

    v1 anchors signed the single chain of before (now ``legacy``); v2 anchors signed a Merkle root and
    the heads that moved since the previous anchor, so applying them in order rebuilds every root's
    leaves: a root that does not add up means anchor lines are missing (or were reordered)."""
    first_at: dict[tuple[str, int, str], str] = {}
    state: dict[str, tuple[int, str]] = {}
    gap, root = None, None
    for line, a in anchors:
        if a["v"] == 1:
            first_at.setdefault((LEGACY, a["seq"], a["hash"]), a["at"])
            continue
        for chain, seq, value in a["heads"]:
            state[chain] = (seq, value)
            first_at.setdefault((chain, seq, value), a["at"])
        if root is None or a["heads"]:  # an idle anchor signs the root before it again
            root = merkle_root([(k, s, h) for k, (s, h) in state.items()])
        if gap is None and root != a["root"]:
            gap = {
                "problem": "anchor_missing",
                "first_broken_seq": None,
                "chain": "",
                "detail": f"the anchor at line {line} ({a['at']}) does not add up to its signed root: "
                "anchor lines before it are missing or out of order",
            }
    report["anchored_chains"] = len(state) + (1 if any(k[0] == LEGACY for k in first_at) else 0)
    problems = _held_to_anchors(first_at)
    report["anchored_events"] = sum(s for s, _ in state.values())
    if problems:
        first = problems[0]
        return {
            **first,
            "problems": problems[:MAX_REPORTED],
            "summary": f"{first['problem']} in chain {first['chain']} at seq "
            f"{first['first_broken_seq']} ({first['detail']})",
        }
    if gap:
        return {**gap, "summary": gap["detail"]}
    return {}


def _held_to_anchors(first_at: dict[tuple[str, int, str], str]) -> list[dict[str, Any]]:
    """Per chain, the lowest anchored position the database no longer matches."""
    positive = sorted({(chain, seq) for chain, seq, _ in first_at if seq > 0})
    stored = _event_hashes(positive)
    by_chain: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for (chain, seq, value), at in first_at.items():
        by_chain[chain].append((seq, value, at))
    problems = []
    tops: dict[str, int] | None = None
    for chain in sorted(by_chain):
        last_good = 0
        for seq, anchored, at in sorted(by_chain[chain]):
            have = stored.get((chain, seq)) if seq > 0 else GENESIS
            if have == anchored:
                last_good = seq
                continue
            if tops is None:
                tops = dict(AuditEvent.objects.values_list("chain").annotate(top=Max("chain_seq")))
            problems.append(_describe(chain, seq, anchored, have, tops, last_good, at))
            break
    # The most telling first: a whole table gone, then tails cut, then rewrites, then the rest.
    order = {"truncated": 0, "tail_cut": 1, "rewritten": 2, "deleted": 3}
    problems.sort(key=lambda p: (order[p["problem"]], p["chain"]))
    return problems


def _describe(
    chain: str,
    seq: int,
    anchored: str,
    have: str | None,
    tops: dict[str, int],
    last_good: int,
    at: str,
) -> dict[str, Any]:
    signed = f"the anchor of {at} signed {chain} seq {seq} ({anchored[:12]}…)"
    top = tops.get(chain, 0)
    if have is None and not tops:
        problem, first = "truncated", 1
        detail = f"the audit table is empty but {signed}"
    elif have is None and seq > top:
        problem, first = "tail_cut", top + 1
        detail = f"the chain ends at seq {top} but {signed}: seqs {top + 1}..{seq} were cut"
    elif have is None:
        problem, first = "deleted", seq
        detail = f"seq {seq} is missing but {signed}"
    else:
        problem, first = "rewritten", seq
        detail = (
            f"{signed}, the database holds {have[:12]}… there: rows {last_good + 1}..{seq} were "
            "changed and rehashed"
        )
    return {
        "chain": chain,
        "first_broken_seq": first,
        "problem": problem,
        "changed_after_seq": last_good,
        "detail": detail,
    }
