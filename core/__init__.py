"""The kernel every layer may import: roles, errors, actors, auth helpers, row primitives, live hints.
It imports no app of this project."""
