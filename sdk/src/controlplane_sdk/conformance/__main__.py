"""``python -m controlplane_sdk.conformance``: the kit's command line.

It only calls :func:`controlplane_sdk.conformance.main`. Were the kit itself run as ``__main__``,
Python would load it twice (as ``__main__`` and as ``controlplane_sdk.conformance``, which the
agent under test imports): two ``WorkerKilled`` classes, and the killed-worker scenario would not
recognise the exception its own stand-in raised through the agent.
"""

import sys

from controlplane_sdk.conformance import main

sys.exit(main())
