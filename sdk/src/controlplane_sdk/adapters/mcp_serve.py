"""The MCP gateway as a process: ``controlplane-mcp-gateway`` (or ``python -m
controlplane_sdk.adapters.mcp_serve``).

    CONTROLPLANE_TOKEN=… controlplane-mcp-gateway \\
        --url http://127.0.0.1:8000 --run RUN_ID \\
        --upstream payments=http://127.0.0.1:9001/mcp \\
        --upstream files='python -m my_file_tools' \\
        --http 8765          # streamable HTTP at http://127.0.0.1:8765/mcp; omit for stdio

An upstream is a URL (streamable HTTP) or a command line (started, spoken to over stdio). The
gateway claims the run (waiting ``--claim-wait`` seconds for it to be claimable: a gateway that
replaces one that died waits for the old lease to expire and recovery to queue the run again).
With ``--finish-on-exit`` the run's attempt ends ``succeeded`` when the gateway stops (stdio: the
client hung up; HTTP: SIGTERM/SIGINT); without it the run stays for the next gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import signal
import sys
from typing import Any

from ..aio import AsyncClient
from .mcp_gateway import McpGateway


def upstream_target(spec: str) -> Any:
    """``http(s)://…`` as is (streamable HTTP), anything else a command to run over stdio."""
    if spec.startswith(("http://", "https://")):
        return spec
    from mcp import StdioServerParameters

    cmd = shlex.split(spec)
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="controlplane-mcp-gateway")
    p.add_argument("--url", default=os.environ.get("CONTROLPLANE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--token-env", default="CONTROLPLANE_TOKEN", help="env var with the token")
    p.add_argument("--run", required=True, help="the run whose tool calls this gateway governs")
    p.add_argument("--worker", default="mcp-gateway", help="worker name on the run's attempts")
    p.add_argument("--upstream", action="append", default=[], metavar="NAME=URL_OR_COMMAND")
    p.add_argument("--http", type=int, default=None, metavar="PORT", help="serve streamable HTTP")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--path", default="/mcp")
    p.add_argument("--claim-wait", type=float, default=120.0)
    p.add_argument("--pause-wait", type=float, default=0.0)
    p.add_argument("--call-timeout", type=float, default=30.0)
    p.add_argument("--finish-on-exit", action="store_true")
    args = p.parse_args(argv)
    if not args.upstream:
        p.error("give at least one --upstream NAME=URL_OR_COMMAND")
    if not os.environ.get(args.token_env):
        p.error(f"set {args.token_env} to the worker token")
    return args


async def serve(args: argparse.Namespace) -> None:
    upstreams = dict(u.split("=", 1) for u in args.upstream)
    client = AsyncClient(args.url, os.environ[args.token_env])
    gateway = McpGateway(
        None,
        {name: upstream_target(spec) for name, spec in upstreams.items()},
        client=client,
        run_id=args.run,
        worker_name=args.worker,
        claim_wait_s=args.claim_wait,
        pause_wait_s=args.pause_wait,
        call_timeout_s=args.call_timeout,
    )
    async with gateway:
        assert gateway.ctx is not None
        print(f"gateway for run {args.run}: attempt {gateway.ctx.attempt.number}", file=sys.stderr)
        if args.http is None:
            await gateway.serve_stdio()
        else:
            print(f"listening on http://{args.host}:{args.http}{args.path}", file=sys.stderr)
            await gateway.serve_http(args.host, args.http, args.path, timeout_graceful_shutdown=2)
        if args.finish_on_exit:
            await gateway.finish("succeeded")
    await client.aclose()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse(argv)
    if args.http is None:  # stdio: a SIGTERM ends the process (the run stays for the next one)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    else:  # uvicorn shuts down on SIGTERM itself, then raises it again: then let it pass
        signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
