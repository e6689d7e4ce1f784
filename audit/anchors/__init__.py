"""Signed checkpoints of the audit chains, kept outside the database.

A chain proves that its rows link to each other, but anyone who can write the table can also truncate
it, cut its tail, or rewrite rows and recompute every hash after them: the chains are not keyed. An
anchor (v2) is a global checkpoint: the Merkle root over every chain's head (chain, seq, hash), the
heads that moved since the previous anchor, and the time, signed with Ed25519 and appended to a sink
the database cannot reach (a directory by default). Replaying the anchors' heads in order rebuilds the
full set each root was computed over (a missing anchor line shows as a root that does not add up), and
``verify_anchors`` holds the database to every head it ever showed: an anchored (chain, seq, hash) that
is gone or different names the chain and the position where it stopped matching.

Anchors of the single chain before per-chain audit (v1: seq, hash) are checked against the ``legacy``
chain, as before. Guarantee: in every chain, rows up to the newest anchored head that still matches are
exactly as they were when anchored; rows after it are covered only by the chain itself (one interval).
"""
