"""The Merkle root of every chain head: one hash that commits to (chain, seq, hash) of all chains.

Leaves are the heads sorted by chain key; a leaf and an inner node are hashed with different prefixes
(0x00, 0x01) so that no inner node can pass for a leaf. An odd node at the end of a level is carried up
as it is. The root of no chains is the hash of nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from audit.chain.hashing import canonical

Leaf = tuple[str, int, str]  # (chain key, seq, hash of the event at seq)


def leaf_hash(leaf: Leaf) -> bytes:
    return hashlib.sha256(b"\x00" + canonical({"l": list(leaf)})).digest()


def merkle_root(leaves: Iterable[Leaf]) -> str:
    level = [leaf_hash(leaf) for leaf in sorted(leaves)]
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        paired = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0].hex()
