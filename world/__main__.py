"""``python -m world [--host H] [--port P] [--db PATH] [--send-delay S] [--commit-delay S] [-v]``.

Defaults come from WORLD_HOST / WORLD_PORT / WORLD_DB / WORLD_SEND_DELAY / WORLD_COMMIT_SECONDS, then 127.0.0.1:8100 and
var/world.sqlite3. The world keeps its state in that file, so a restart changes nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from .server import make_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m world", description="Run the demo world HTTP service."
    )
    parser.add_argument("--host", default=os.environ.get("WORLD_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("WORLD_PORT", "8100")))
    parser.add_argument("--db", default=os.environ.get("WORLD_DB", "var/world.sqlite3"))
    parser.add_argument(
        "--send-delay",
        type=float,
        default=float(os.environ.get("WORLD_SEND_DELAY", "2.0")),
        help="seconds after enqueue at which a queued notification counts as sent",
    )
    parser.add_argument(
        "--commit-delay",
        type=float,
        default=float(os.environ.get("WORLD_COMMIT_SECONDS", "0") or 0),
        help="seconds a mutating call takes before it commits (jittered 0.5-1.5x; default 0)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every HTTP request")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s world %(levelname)s %(message)s")
    if args.db != ":memory:":
        Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    server = make_server(
        args.host,
        args.port,
        args.db,
        send_delay_s=args.send_delay,
        verbose=args.verbose,
        commit_delay_s=args.commit_delay,
    )
    # SIGTERM -> KeyboardInterrupt, so the loop below exits cleanly and closes the database.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    host, port = server.socket.getsockname()[:2]
    # The "listening" line is what scripts and tests wait for (port 0 picks a free port).
    print(f"world listening on http://{host}:{port} db={args.db}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.world.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
