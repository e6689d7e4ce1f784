"""Backup and restore (docs/operations/jobs-and-backup.md), on real processes: ``pg_dump`` of the
live system (an API process serving SDK workers while the dump runs) restored with ``pg_restore``
into a new database, after which ``audit_verify --anchors`` passes; the same dump restored after the
system moved on and signed a newer anchor is reported as a cut tail against the external anchors."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from controlplane_sdk import Client
from tests.deploy.hosts import start_api, start_redis
from tests.live import ROOT, server_env, test_database_url, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _work(base: str, token: str, stop: threading.Event, done: list, errors: list) -> None:
    sdk = Client(base, token, timeout=30)
    try:
        for n in range(500):  # a bound whatever happens
            if stop.is_set():
                return
            run = sdk.create_run(
                "purchasing", f"backup-{n}", versions={"code": "1.0.0"},
                authority=[{"scope": "payments:charge", "ttl_s": 3600}],
            )  # fmt: skip
            token_ = sdk.claim(run["id"], "worker-1").lease.fencing_token
            effect = sdk.declare_effect(
                run["id"], token_, step="charge", tool="payments", action="charge",
                idempotency_key=f"backup-{n}", args={"amount": 1},
            )  # fmt: skip
            sdk.record_outcome(effect.id, token_, "committed", external_ref=str(n))
            sdk.finish(run["id"], token_, "succeeded")
            done.append(run["id"])
    except Exception as exc:  # the test reports it
        errors.append(repr(exc))
    finally:
        sdk.close()


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def _with_db(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


def test_a_dump_of_the_live_system_restores_and_verifies_and_an_older_one_is_caught(
    procs, tmp_path, worker_token
):
    for tool in ("pg_dump", "pg_restore", "createdb", "dropdb"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (PostgreSQL's client tools)")
    key = tmp_path / "anchor-signing.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    redis = start_redis(procs)
    env = server_env(
        tmp_path,
        REDIS_URL=f"redis://127.0.0.1:{redis}/0",
        ANCHOR_DIR=str(tmp_path / "anchors"),
        ANCHOR_SIGNING_KEY=str(key),
        ANCHOR_INTERVAL_S="0",  # the test writes the anchors itself, at the moments it needs
    )
    base, _ = start_api(procs, env)
    live_url = test_database_url()
    restored = f"{Path(live_url).name}_restore_{uuid.uuid4().hex[:8]}"
    stop, done, errors = threading.Event(), [], []
    load = threading.Thread(target=_work, args=(base, worker_token, stop, done, errors))
    load.start()
    try:
        wait_for("some runs finished", lambda: len(done) >= 3 or errors, 60)
        anchored = _manage(env, "audit_anchor")
        assert anchored.returncode == 0, anchored.stderr
        wait_for("more runs after the anchor", lambda: len(done) >= 6 or errors, 60)
        # the backup, taken while the workers write (one consistent snapshot)
        dump = tmp_path / "live.dump"
        subprocess.run(["pg_dump", "-Fc", "-f", str(dump), live_url], check=True, timeout=120)
        at_dump = len(done)
        subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", restored], check=True)
        subprocess.run(
            ["pg_restore", "--no-owner", "--no-privileges", "-d", _with_db(live_url, restored),
             str(dump)], check=True, timeout=120,
        )  # fmt: skip
        restored_env = dict(env, DATABASE_URL=_with_db(live_url, restored))

        # 1. the restore verifies against the anchors written up to the backup
        fresh = _manage(restored_env, "audit_verify", "--anchors")
        assert fresh.returncode == 0, fresh.stdout + fresh.stderr

        # 2. the live system moves on and signs a newer anchor; the same backup is now an older
        # point, and restoring it is caught: the anchors name the chains it cut
        wait_for("runs after the backup", lambda: len(done) >= at_dump + 3 or errors, 60)
        anchored = _manage(env, "audit_anchor")
        assert anchored.returncode == 0, anchored.stderr
        assert _manage(env, "audit_verify", "--anchors").returncode == 0  # the live one is whole
        older = _manage(restored_env, "audit_verify", "--anchors")
        assert older.returncode != 0, older.stdout
        assert "tail_cut" in older.stdout + older.stderr, older.stdout + older.stderr
        assert errors == [], errors
    finally:
        stop.set()
        load.join(60)
        subprocess.run(
            ["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", "--force", restored],
            check=False,
        )
