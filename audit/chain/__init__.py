"""The audit chains: how a link is hashed (``hashing``), appending an event to its chain in one
statement (``append``), and walking every chain link by link (``verify``)."""
