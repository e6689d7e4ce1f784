"""Shared plumbing for the benchmarks: database preparation, ASGI server processes, CPU accounting,
percentiles and machine facts. Nothing here imports Django: the benchmark's parent process drives the
control plane from the outside (management commands, HTTP), like an operator would."""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/controlplane_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
AGENT = "bench"
SCOPES = ["bench:*"]


# --- environment ---------------------------------------------------------------------------------


COMMIT_SETTINGS = ("on", "off", "local", "remote_write", "remote_apply")


def synchronous_commit() -> str:
    """The commit behaviour every side of a benchmark runs with: ``BENCH_SYNCHRONOUS_COMMIT``, else
    ``on`` (PostgreSQL's default and production's). Never the test shell's ``DB_SYNCHRONOUS_COMMIT``:
    a server inheriting ``off`` while the DBOS peer commits with ``on`` compares unlike commits."""
    value = os.environ.get("BENCH_SYNCHRONOUS_COMMIT", "") or "on"
    if value not in COMMIT_SETTINGS:
        raise SystemExit(f"BENCH_SYNCHRONOUS_COMMIT={value!r}: one of {', '.join(COMMIT_SETTINGS)}")
    return value


def commit_env(env: dict[str, str]) -> str:
    """Set the commit behaviour explicitly and equally in ``env`` (the API servers read
    ``DB_SYNCHRONOUS_COMMIT``; DBOS, raw PostgreSQL and the meters' libpq connections ``PGOPTIONS``)
    and in this process's environment (its spawned workers inherit it). Returns the value."""
    value = synchronous_commit()
    kept = re.sub(
        r"(?:-c\s*|--)synchronous[_-]commit=\S*", "", os.environ.get("PGOPTIONS", "")
    ).split()
    pgoptions = " ".join([*kept, f"-c synchronous_commit={value}"])
    for target in (env, os.environ):
        target["DB_SYNCHRONOUS_COMMIT"] = value
        target["PGOPTIONS"] = pgoptions
    return value


def bench_env(database_url: str, redis_url: str) -> dict[str, str]:
    """Environment for manage.py and the servers: PostgreSQL + Redis, DEBUG off (no query log), quiet,
    the commit behaviour set explicitly (``commit_env``)."""
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])
            ),
        }
    )
    env.pop("CONTROLPLANE_PRODUCTION", None)
    commit_env(env)
    return env


def service_urls(program: str, why: str = "") -> tuple[str, str]:
    """DATABASE_URL and REDIS_URL from the environment, else the benchmark defaults; a benchmark needs
    PostgreSQL, so anything else ends the program with a message."""
    database_url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    redis_url = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    if not database_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(f"{program} needs a PostgreSQL DATABASE_URL{why}")
    return database_url, redis_url


def python_exe() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def daphne_exe() -> str:
    venv = ROOT / ".venv" / "bin" / "daphne"
    if venv.exists():
        return str(venv)
    found = shutil.which("daphne")
    if not found:
        raise SystemExit("daphne not found: run `make venv` first")
    return found


def redact(url: str) -> str:
    """A database URL without its password, for the results file."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


def describe_failure(resp) -> str:
    """`HTTP 409 lease_held: …` for JSON errors, `HTTP 500 (non-JSON body)` for Django's HTML 500 page."""
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code} (non-JSON body)"
    if isinstance(body, dict):
        return f"HTTP {resp.status_code} {body.get('error', '')}: "
        f"{str(body.get('detail') or body.get('reason') or '')[:200]}"
    return f"HTTP {resp.status_code}: {str(body)[:200]}"


# --- database ------------------------------------------------------------------------------------


def ensure_database(database_url: str, fresh: bool = False) -> bool:
    """CREATE DATABASE if it does not exist yet (with fresh=True: DROP it first). True if it was created."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(database_url)
    name = str(params.get("dbname") or "")
    if not name:
        raise SystemExit(f"DATABASE_URL names no database: {redact(database_url)}")
    admin: dict[str, Any] = {k: v for k, v in params.items() if k != "dbname"}
    with psycopg.connect(dbname="postgres", autocommit=True, **admin) as conn:
        if fresh:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return True


def manage(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [python_exe(), "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        hint = (
            (
                "\n(the benchmark database holds migrations that no longer match the code: rerun with --fresh-db "
                "to drop and recreate it)"
            )
            if args[0] == "migrate"
            else ""
        )
        raise SystemExit(
            f"manage.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
            f"{proc.stderr[-3000:]}{hint}"
        )
    return proc.stdout


def prepare(env: dict[str, str], token_name: str) -> tuple[str, str]:
    """Migrate, register the bench agent, issue a worker token. Returns (secret, visible prefix)."""
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(
        env,
        "register_agent",
        AGENT,
        *[a for s in SCOPES for a in ("--scope", s)],
        "--description",
        "benchmark agent (bench/)",
    )
    out = manage(env, "create_worker_token", token_name, "--agent", AGENT).strip().splitlines()
    secret = out[-1].strip()
    prefix = out[0].split("worker token ", 1)[-1].split("…", 1)[0].strip() if out else ""
    return secret, prefix


def revoke_token(env: dict[str, str], prefix: str) -> None:
    if prefix:
        subprocess.run(
            [python_exe(), "manage.py", "revoke_token", prefix],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )


def dbname_of(database_url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(database_url).get("dbname", ""))


def scalar(conn: Any, query: str) -> Any:
    """The one value of a query that always returns one row (SHOW, count(*))."""
    row = conn.execute(query).fetchone()
    if row is None:
        raise RuntimeError(f"{query!r} returned no row")
    return row[0]


def postgres_facts(database_url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        facts: dict[str, Any] = {"version": scalar(conn, "SHOW server_version")}
        for setting in (
            "synchronous_commit",
            "fsync",
            "wal_sync_method",
            "shared_buffers",
            "max_connections",
            "commit_delay",
        ):
            try:
                facts[setting] = scalar(conn, f"SHOW {setting}")
            except psycopg.Error:
                pass
        facts["host"] = conn.info.host
    return facts


# --- ASGI servers --------------------------------------------------------------------------------


def free_port(taken: Iterable[int] = ()) -> int:
    """A free port: the OS's choice, or the first free one in BENCH_PORTS ("20700-20799") when set, for
    machines where each user keeps to a range."""
    span = os.environ.get("BENCH_PORTS", "")
    if span:
        low, _, high = span.partition("-")
        for port in range(int(low), int(high or low) + 1):
            if port in taken:  # handed out already, its server not listening yet
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port in BENCH_PORTS={span}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_KINDS = ("daphne", "uvicorn", "granian")


def server_command(kind: str, port: int) -> list[str]:
    """One ASGI server process serving controlplane.asgi:application (HTTP and WebSockets) on `port`.
    uvicorn and granian come with the ``bench`` extra; neither runs Django's (absent) lifespan."""
    app = "controlplane.asgi:application"
    if kind == "daphne":
        return [daphne_exe(), "-b", "127.0.0.1", "-p", str(port), app]
    exe = ROOT / ".venv" / "bin" / kind
    if not exe.exists() and not shutil.which(kind):
        raise SystemExit(f"{kind} not found: pip install -e '.[bench]'")
    exe_path = str(exe) if exe.exists() else str(shutil.which(kind))
    if kind == "uvicorn":
        return [
            *(exe_path, app, "--host", "127.0.0.1", "--port", str(port)),
            *("--loop", "uvloop", "--http", "httptools", "--ws", "websockets"),
            *("--lifespan", "off", "--no-access-log", "--log-level", "warning"),
        ]
    if kind == "granian":
        return [
            *(exe_path, "--interface", "asginl", "--host", "127.0.0.1", "--port", str(port)),
            *("--workers", "1", "--loop", "uvloop", "--no-access-log", "--log-level", "warning"),
            app,
        ]
    raise ValueError(f"unknown server kind {kind!r}: one of {', '.join(SERVER_KINDS)}")


@dataclass
class Servers:
    """K ASGI server processes (daphne unless `kind` says otherwise), each in its own session so
    Ctrl-C reaches us (and our cleanup) first."""

    count: int
    env: dict[str, str]
    kind: str = "daphne"
    procs: list[subprocess.Popen] = field(default_factory=list)
    keep_logs: bool = False
    ports: list[int] = field(default_factory=list)
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cp-bench-")))

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> None:
        for i in range(self.count):
            port = free_port(taken=self.ports)
            log = open(self.logdir / f"server-{i}.log", "wb")
            proc = subprocess.Popen(
                server_command(self.kind, port),
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            self.procs.append(proc)
            self.ports.append(port)

    def wait_ready(self, timeout: float = 90) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        pending = dict(zip(self.urls, self.procs, strict=False))
        while pending:
            for url, proc in list(pending.items()):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"server {url} exited with {proc.returncode}:\n{self.log_tail()}"
                    )
                try:
                    resp = httpx.get(f"{url}/api/v1/openapi.json", timeout=5)
                    if resp.status_code < 500:
                        pending.pop(url)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise RuntimeError(
                    f"servers not ready after {timeout:.0f}s: {list(pending)}\n{self.log_tail()}"
                )
            if pending:
                time.sleep(0.2)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every server's log; the log directory is then kept for inspection."""
        self.keep_logs = True
        out = [f"server logs kept in {self.logdir}"]
        for log in sorted(self.logdir.glob("server-*.log")):
            text = log.read_text(errors="replace")
            out.append(f"--- {log.name}\n{text[-chars:]}")
        return "\n".join(out)

    def stop(self) -> None:
        # A second Ctrl-C must not interrupt the cleanup itself.
        previous = {
            sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._stop()
            if not self.keep_logs:
                shutil.rmtree(self.logdir, ignore_errors=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)
        self.procs.clear()


def install_sigterm_as_interrupt() -> None:
    """SIGTERM/SIGHUP behave like Ctrl-C, so `finally:` blocks stop the servers."""

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_interrupt)


def stop_processes(procs) -> None:
    """Terminate multiprocessing children that are still alive (after an error or Ctrl-C)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def run_workers(
    ctx,
    servers: Servers,
    count: int,
    target,
    args_of,
    timeout: float,
    what: str,
    kwargs: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], CpuUse]:
    """Start ``count`` processes running ``target(*args_of(i), barrier, results)``, release them together
    from a barrier, and collect one report from each (a dict; ``{"fatal": …}`` if one failed). Returns
    the reports and the CPU the servers, PostgreSQL and the machine spent from the barrier to the last
    report. Raises if a process dies, a report says fatal, or ``timeout`` passes; always stops them."""
    barrier = ctx.Barrier(count + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=target, daemon=True, args=(*args_of(i), barrier, results), kwargs=kwargs or {}
        )
        for i in range(count)
    ]
    meter = CpuMeter(
        servers.pids,
        dbname_of(servers.env["DATABASE_URL"]),
        stat_urls=servers.urls,
        database_url=servers.env["DATABASE_URL"],
    )
    try:
        for p in procs:
            p.start()
        # The first reading while every worker waits at the barrier, not after their release: the
        # reading asks the servers for their statement counts over HTTP, which on a loaded machine
        # can take longer than a tiny workload, whose statements would then fall before it.
        _await_arrivals(barrier, procs, count, timeout=120)
        meter.start()
        barrier.wait(timeout=120)
        reports: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(reports) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"{what} with {count} workers did not finish within {timeout:.0f}s"
                )
            try:
                reports.append(results.get(timeout=min(remaining, 5)))
            except Exception:  # queue.Empty: check the workers are still alive
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(
                        f"{len(dead)} worker process(es) died (exit {dead[0].exitcode})"
                    ) from None
        cpu = meter.stop()
        for p in procs:
            p.join(timeout=10)
    finally:
        stop_processes(procs)
    fatal = [r["fatal"] for r in reports if "fatal" in r]
    if fatal:
        raise RuntimeError(f"{what}: worker failed: {fatal[0]}")
    return reports, cpu


def _await_arrivals(barrier, procs, count: int, timeout: float) -> None:
    """Until ``count`` parties wait at ``barrier``; raises if a worker dies first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while barrier.n_waiting < count:
        dead = [p for p in procs if not p.is_alive()]
        if dead:
            raise RuntimeError(
                f"{len(dead)} worker process(es) died before the start (exit {dead[0].exitcode})"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {barrier.n_waiting} of {count} workers ready after {timeout:.0f}s"
            )
        time.sleep(0.01)


# --- CPU accounting (Linux /proc) ----------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def with_descendants(pids: list[int]) -> list[int]:
    """`pids` and every process below them (by /proc/*/stat's parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def postgres_backends_cpu(dbname: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend connected to `dbname` (found by its process title)."""
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            title = (
                (entry / "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .split()
            )
        except OSError:
            continue
        if dbname in title:
            found[int(entry.name)] = proc_cpu_s(int(entry.name))
    return found


def machine_cpu() -> tuple[float, float]:
    """(busy seconds, total seconds) summed over all CPUs since boot."""
    try:
        parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    total = sum(parts[:8])
    return (total - idle) / _TICK, total / _TICK


class _CpuUseBase(TypedDict):
    servers_cpu_s: float
    postgres_cpu_s: float
    machine_busy_s: float
    machine_busy_pct: float | None  # None when no machine time passed


class CpuUse(_CpuUseBase, total=False):
    # SQL statements the servers sent (bench/sqlcount.py; None unless they run bench.settings) and
    # pg_stat_database's counters for the benchmark database over the same window.
    statements: int | None
    db: dict[str, int] | None


DB_COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")


def server_statements(urls: list[str]) -> int | None:
    """The SQL statements the servers at `urls` have sent so far (GET /bench/stats/, bench.settings
    only); None if any server does not say."""
    import httpx

    total = 0
    for url in urls:
        try:
            total += int(httpx.get(f"{url}/bench/stats/", timeout=10).json()["statements"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
    return total


def db_counters(database_url: str) -> dict[str, int] | None:
    """pg_stat_database's transaction and row counters of the database. PostgreSQL publishes a busy
    backend's counters at most once a second and an idle one's within 10 s, so a window's delta is
    approximate at its edges (the benchmark reports it as such)."""
    import psycopg

    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT {', '.join(DB_COUNTERS)} FROM pg_stat_database "
                "WHERE datname = current_database()"
            ).fetchone()
    except psycopg.Error:
        return None
    return dict(zip(DB_COUNTERS, (int(v) for v in row), strict=True)) if row else None


class CpuMeter:
    """CPU spent by the servers, by the PostgreSQL backends of the benchmark's database and by the whole
    machine between start() and stop(); with `stat_urls` also the SQL statements the servers sent, and
    with `database_url` the database's transaction and row counters."""

    def __init__(
        self,
        server_pids: list[int],
        dbname: str,
        stat_urls: list[str] | None = None,
        database_url: str | None = None,
    ):
        self.server_pids, self.dbname = server_pids, dbname
        self.stat_urls, self.database_url = stat_urls, database_url

    def _sample(self) -> tuple[float, dict[int, float], float, float]:
        busy, total = machine_cpu()
        return (
            # granian serves from a worker child process: count each server's whole process tree
            sum(proc_cpu_s(p) for p in with_descendants(self.server_pids)),
            postgres_backends_cpu(self.dbname),
            busy,
            total,
        )

    def _counters(self) -> tuple[int | None, dict[str, int] | None]:
        statements = server_statements(self.stat_urls) if self.stat_urls else None
        return statements, db_counters(self.database_url) if self.database_url else None

    def start(self) -> None:
        self.c0 = self._counters()
        self.t0 = self._sample()

    def stop(self) -> CpuUse:
        s0, pg0, busy0, total0 = self.t0
        s1, pg1, busy1, total1 = self._sample()
        servers, busy, total = s1 - s0, busy1 - busy0, total1 - total0
        pg = sum(
            max(cpu - pg0.get(pid, 0.0), 0.0) for pid, cpu in pg1.items()
        )  # new backends count whole
        use: CpuUse = {
            "servers_cpu_s": round(servers, 2),
            "postgres_cpu_s": round(pg, 2),
            "machine_busy_s": busy,
            "machine_busy_pct": round(100 * busy / total, 1) if total else None,
        }
        if self.stat_urls or self.database_url:
            (st0, db0), (st1, db1) = self.c0, self._counters()
            use["statements"] = st1 - st0 if st0 is not None and st1 is not None else None
            use["db"] = {k: db1[k] - db0[k] for k in DB_COUNTERS} if db0 and db1 else None
        return use


# --- statistics and facts --------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100)
    return round(ordered[int(rank) - 1], 2)


def machine_info(database_url: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        info["cpu_model"] = model
    except (OSError, StopIteration):
        pass
    try:
        info["memory_gb"] = round(
            int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1
        )
    except (OSError, ValueError, IndexError):
        pass
    try:
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    info["postgres"] = postgres_facts(database_url)
    return info


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return (
            out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
            if out.returncode == 0
            else None
        )
    except (OSError, subprocess.SubprocessError):
        return None
