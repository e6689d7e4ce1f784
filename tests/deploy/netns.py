"""Hosts on one machine for the faults test: each host a network namespace joined to the root
namespace by a veth pair (its own /30), and the links between them that the test can cut, heal or
degrade. Names are unique per run and everything is removed when the ``Network`` closes, whether
the test passed or not.

The root namespace stands for the network in between: HAProxy (the load balancer), the private
Redis and the forwarders to PostgreSQL (the database host) listen there, on the root side's
addresses. PostgreSQL itself listens on 127.0.0.1 only, which no namespace can route to: a
``Link`` (a TCP forwarder in the root namespace) is the database's address on that host's link,
and the place where latency and stalls are injected when the kernel has no netem."""

from __future__ import annotations

import random
import secrets
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

from tests.live import Procs, free_port


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def namespaces_permitted() -> str | None:
    """Why this machine cannot run namespaced hosts, or None if it can (tried, then removed)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"cpprobe{secrets.token_hex(3)}"
    try:
        made = ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
        veth = ip(
            "link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b", check=False
        )
        if veth.returncode != 0:
            return f"veth pairs cannot be made here: {veth.stderr.strip()}"
        return None
    finally:
        ip("link", "del", f"{probe}a", check=False)
        ip("netns", "del", probe, check=False)


@dataclass
class Host:
    name: str
    ns: str
    root_if: str  # the veth end in the root namespace: the host's link, as the network sees it
    root_ip: str  # the network's address on this link (HAProxy, Redis and PostgreSQL for it)
    ip: str  # the host's own address

    def cmd(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]


@dataclass
class Network:
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: int = field(default_factory=lambda: random.randrange(16, 250))
    hosts: list[Host] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)

    def add_host(self, name: str) -> Host:
        i = len(self.hosts)
        ns, root_if = f"cpf{self.tag}{name}", f"cf{self.tag}{i}r"
        base = f"10.{self.subnet}.{i}"
        host = Host(name, ns, root_if, f"{base}.1", f"{base}.2")
        self.hosts.append(host)  # before anything is made: close() removes what was made
        ip("netns", "add", ns)
        ip("link", "add", root_if, "type", "veth", "peer", "name", f"cf{self.tag}{i}n")
        ip("link", "set", f"cf{self.tag}{i}n", "netns", ns)
        ip("addr", "add", f"{host.root_ip}/30", "dev", root_if)
        ip("link", "set", root_if, "up")
        ip("-n", ns, "addr", "add", f"{host.ip}/30", "dev", f"cf{self.tag}{i}n")
        ip("-n", ns, "link", "set", f"cf{self.tag}{i}n", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        return host

    def service_address(self, host: Host) -> str:
        """A second address of the network on ``host``'s link (for the database's forwarder), so
        :meth:`blackhole` can drop the host's packets to it alone, not its traffic with HAProxy."""
        i = self.hosts.index(host)
        address = f"10.{self.subnet}.{100 + i}.1"
        ip("addr", "add", f"{address}/32", "dev", host.root_if)
        ip("-n", host.ns, "route", "add", f"{address}/32", "dev", self._ns_if(host))
        return address

    def blackhole(self, host: Host, address: str) -> None:
        """Packets from ``host`` to ``address`` vanish without a trace: they are sent to a link
        address nobody has, so the network drops them (no refusal, no reset, no ICMP). Connections
        hang: a new one until its connect timeout, an open one until TCP gives up on it."""
        ip("-n", host.ns, "neigh", "replace", address, "lladdr", "02:00:00:00:00:01",
           "dev", self._ns_if(host), "nud", "permanent")  # fmt: skip

    def unblackhole(self, host: Host, address: str) -> None:
        ip("-n", host.ns, "neigh", "del", address, "dev", self._ns_if(host), check=False)

    def _ns_if(self, host: Host) -> str:
        return host.root_if[:-1] + "n"

    def partition(self, host: Host) -> None:
        """The host's link goes down: every packet to and from it is dropped, connections included."""
        ip("link", "set", host.root_if, "down")

    def heal(self, host: Host) -> None:
        ip("link", "set", host.root_if, "up")

    def netem(self, host: Host, *spec: str) -> str | None:
        """``tc qdisc … netem`` on the host's link; the kernel's refusal if it has no netem."""
        done = subprocess.run(
            ["tc", "qdisc", "replace", "dev", host.root_if, "root", "netem", *spec],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return None if done.returncode == 0 else done.stderr.strip() or "tc failed"

    def link(self, host: Host, target: tuple[str, int], bind: str | None = None) -> Link:
        link = Link(bind or host.root_ip, target)
        self.links.append(link)
        return link

    def close(self) -> None:
        for link in self.links:
            link.cut()
        for host in self.hosts:
            # our own processes only: whatever still runs in the namespaces this run made
            pids = ip("netns", "pids", host.ns, check=False).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True, timeout=5)
            ip("link", "del", host.root_if, check=False)
            ip("netns", "del", host.ns, check=False)

    def leftovers(self) -> list[str]:
        names = ip("netns", "list", check=False).stdout + ip("-br", "link", check=False).stdout
        return [h.ns for h in self.hosts if h.ns in names] + [
            h.root_if for h in self.hosts if h.root_if in names
        ]


class Link:
    """A TCP forwarder on ``bind``:<port> to ``target``, with faults: ``degrade(delay_s, stall_p,
    stall_s)`` delays every segment it passes by ``delay_s`` each way, and holds a ``stall_p`` share
    of them ``stall_s`` longer (what a lost segment costs TCP: a retransmission timeout);
    ``cut()`` closes the listener and every connection (the host's link to the database is down:
    new connections are refused, open ones reset); ``heal()`` listens again on the same port."""

    def __init__(self, bind: str, target: tuple[str, int]) -> None:
        self.bind, self.target, self.port = bind, target, free_port()
        self.delay_s = self.stall_p = self.stall_s = 0.0
        self.passed = self.stalled = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self.heal()

    def heal(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.bind, self.port))
        self._listener.listen(128)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def degrade(self, delay_s: float = 0.0, stall_p: float = 0.0, stall_s: float = 0.2) -> None:
        self.delay_s, self.stall_p, self.stall_s = delay_s, stall_p, stall_s

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in [self._listener, *conns]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                wait = self.delay_s
                if self.stall_p and random.random() < self.stall_p:
                    wait += self.stall_s
                    self.stalled += 1
                if wait:
                    time.sleep(wait)
                self.passed += 1
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


HAPROXY_CONFIG = """\
global
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    # a request to a host that refuses or drops the connection goes to the other host: those never
    # reached an API process, so sending them again cannot do anything twice
    retries 3
    option redispatch 1
    retry-on conn-failure 503
frontend api
{binds}
    default_backend hosts
backend hosts
    balance roundrobin
    # readiness, not liveness: a host that lost its database leaves the rotation within a second
    option httpchk GET /readyz
    http-check expect status 200
    timeout check 3s
    default-server inter 500ms fall 2 rise 1
{servers}
"""


def start_haproxy(
    procs: Procs, api_hosts: list[tuple[str, int]], binds: list[str]
) -> tuple[int, object]:
    """The load balancer in the root namespace, on each worker link's root address and 127.0.0.1."""
    port = free_port()
    config = procs.tmp / "haproxy.cfg"
    config.write_text(
        HAPROXY_CONFIG.format(
            binds="\n".join(f"    bind {b}:{port}" for b in ["127.0.0.1", *binds]),
            servers="\n".join(
                f"    server r{i} {h}:{p} check" for i, (h, p) in enumerate(api_hosts)
            ),
        )
    )
    _, log = procs.start(
        "haproxy", [shutil.which("haproxy") or "haproxy", "-db", "-f", str(config)], {}
    )
    return port, log
