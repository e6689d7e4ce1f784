"""The demo agents: realistic runs through the SDK against the demo world (docs/operations/demo.md, "The demo world").

They use only the public SDK (``controlplane_sdk``) and the world's HTTP client
(``world.client.WorldClient``); nothing here imports Django or the control plane's internals.

* :mod:`demo_agents.purchasing` -- reads price and stock (assumptions), reserves inventory, delegates address
  verification to a child run, buys a shipping label, charges the card (approval above a threshold) and
  queues the customer notification; checkpoints between steps.
* :mod:`demo_agents.address_verifier` -- the child: verifies and normalises a shipping address.
* :mod:`demo_agents.refunds` -- looks up a charge, refunds it (with a timer-backed SLA) and tells the customer.
* :mod:`demo_agents.worker` -- ``python -m demo_agents.worker --name NAME``: one process serving the agents.
* :mod:`demo_agents.traffic` -- ``python -m demo_agents.traffic``: keeps producing runs with a realistic mix.

Configuration comes from the environment: ``CONTROLPLANE_URL``, ``CONTROLPLANE_TOKEN`` (a worker
token), ``WORLD_URL``, plus the tuning knobs documented in :mod:`demo_agents.common`.
"""
