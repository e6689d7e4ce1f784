"""Fleet operations: one intervention over every run a filter selects, issued in waves.

By job: ``selection`` (which runs a filter picks and why one is refused), ``operations`` (preview,
start, confirm, cancel, halt: the services), ``waves`` (the outbox job that issues one wave's
decisions), ``selectors`` (reads for the edges). Imports go one way: waves -> operations ->
selection; nothing here imports ``waves`` (the app registry imports it when the app is ready).
"""
