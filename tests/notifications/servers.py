"""Real receivers on loopback, each its own process: an HTTP server that writes every request it
gets to a JSON Lines file, and aiosmtpd writing every message to one."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

HTTP = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
out = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(out, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers), "body": body.decode()}) + "\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

SMTP = r"""
import json, sys, time
from aiosmtpd.controller import Controller
out = sys.argv[2]
class Handler:
    async def handle_DATA(self, server, session, envelope):
        with open(out, "a") as f:
            f.write(json.dumps({"from": envelope.mail_from, "to": envelope.rcpt_tos,
                                "data": envelope.content.decode("utf8", "replace")}) + "\n")
        return "250 OK"
c = Controller(Handler(), hostname="127.0.0.1", port=int(sys.argv[1]))
c.start()
while True:
    time.sleep(3600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    def __init__(self, script: str, port: int, out: Path):
        self.script, self.port, self.out = script, port, out
        self.proc: subprocess.Popen | None = None

    def start(self) -> Receiver:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.script, str(self.port), str(self.out)]
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("receiver did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def received(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]


def http_receiver(tmp_path: Path) -> Receiver:
    return Receiver(HTTP, free_port(), tmp_path / "http.jsonl")


def smtp_receiver(tmp_path: Path) -> Receiver:
    return Receiver(SMTP, free_port(), tmp_path / "smtp.jsonl")
