"""The demo world: stand-in external systems (inventory, shipping, payments, notifications).

``world.server`` is a stand-alone, standard-library HTTP service (``python -m world``) with its own
SQLite file; ``world.client`` is a small httpx client for it; ``world.adapters`` registers the
control plane's compensators, reconcilers and assumption checkers that talk to it over HTTP.
"""
