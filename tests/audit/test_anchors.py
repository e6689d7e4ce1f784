"""Signed anchors hold the database to every chain head it ever showed.

The attacker here is a PostgreSQL superuser: the protecting triggers are switched off with
``ALTER TABLE … DISABLE TRIGGER ALL`` (rolled back with the test), rows are truncated, cut, rewritten and
rehashed, and the chain head is moved to match, so that the chain alone verifies. Only the anchors,
kept outside the database, can tell.
"""

from __future__ import annotations

import base64
import json
from contextlib import contextmanager

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings as django_settings
from django.core.management import ManagementUtility, call_command
from django.db import connection

from audit.anchors.merkle import merkle_root
from audit.anchors.signing import key_id, public_pem, signed_bytes, signing_key
from audit.anchors.sink import DirectorySink
from audit.anchors.write import AnchorRefused, current_heads, write_anchor
from audit.chain.hashing import GENESIS, link_hash
from audit.integrity import verify_all
from audit.models import SYSTEM, AuditChain, AuditEvent
from audit.services import record_audit, verify_chain
from audit.tasks import write_anchor as write_anchor_task
from core.actors import system_actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only", "anchor_config")]

ACTOR = system_actor("test")


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture
def anchor_config(settings, tmp_path):
    key_file = tmp_path / "signing.pem"
    key_file.write_bytes(_pem(Ed25519PrivateKey.generate()))
    settings.ANCHOR_DIR = str(tmp_path / "anchors")
    settings.ANCHOR_SIGNING_KEY = str(key_file)
    settings.ANCHOR_VERIFY_KEYS = []
    return tmp_path


def _sink_path():
    return DirectorySink().path


def _write(n: int) -> None:
    for i in range(1, n + 1):
        record_audit(
            actor=ACTOR,
            action="test.event",
            object_type="run",
            object_id=f"obj-{i}",
            context={"i": i},
        )


def _write_anchored(n: int) -> None:
    """n events, an anchor after each: the resolution of an anchor check is one event."""
    for _ in range(n):
        _write(1)
        write_anchor()


@contextmanager
def superuser_tampering():
    """What a superuser can do: switch off every trigger of the audit tables (rolled back with the test)."""
    tables = ("audit_auditevent", "audit_auditchain")
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
    yield
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"ALTER TABLE {table} ENABLE TRIGGER ALL")


def _at(seq: int, chain: str = SYSTEM):
    return AuditEvent.objects.filter(chain=chain, chain_seq=seq)


def _set_head(seq: int, head_hash: str, chain: str = SYSTEM) -> None:
    AuditChain.objects.filter(key=chain).update(seq=seq, hash=head_hash)


def _rehash_from(seq: int, chain: str = SYSTEM) -> None:
    """Recompute every hash from ``seq`` to the end and move the head: the chain verifies again."""
    prev = _at(seq - 1, chain).get().hash if seq > 1 else GENESIS
    for event in AuditEvent.objects.filter(chain=chain, chain_seq__gte=seq).order_by("chain_seq"):
        event.prev_hash = prev
        event.hash = link_hash(prev, event.hashed_fields())
        AuditEvent.objects.filter(pk=event.pk).update(prev_hash=event.prev_hash, hash=event.hash)
        prev = event.hash
    top = AuditEvent.objects.filter(chain=chain).order_by("-chain_seq").first()
    _set_head(top.chain_seq, prev, chain)


# --- the tampering an attacker with superuser rights does, each to be named with its position -----


def _edit():
    _at(3).update(reason="approved by the CFO")


def _delete():
    _at(3).delete()


def _insert():
    for seq in (6, 5, 4, 3):
        _at(seq).update(chain_seq=seq + 1)
    forged = AuditEvent(
        seq=10**12,
        chain=SYSTEM,
        chain_seq=3,
        actor_kind="user",
        actor="mallory",
        action="test.forged",
        object_type="run",
        object_id="forged",
        outcome="allowed",
        component="psql",
        prev_hash=_at(2).get().hash,
    )
    forged.hash = link_hash(forged.prev_hash, forged.hashed_fields())
    forged.save(force_insert=True)


def _reorder():
    _at(3).update(chain_seq=-3)
    _at(4).update(chain_seq=3)
    _at(-3).update(chain_seq=4)


def _truncate():
    with connection.cursor() as cur:
        cur.execute("TRUNCATE audit_auditevent")
    AuditChain.objects.all().delete()


def _cut_tail():
    AuditEvent.objects.filter(chain=SYSTEM, chain_seq__gte=4).delete()
    _set_head(3, _at(3).get().hash)


def _rewrite_and_rehash():
    _at(3).update(reason="nothing to see")
    _rehash_from(3)


TAMPERING = {
    # kind: (do it, the report part that names it, its problem, the position named)
    "edit": (_edit, "chain", "edited", 3),
    "delete": (_delete, "chain", "deleted", 3),
    "insert": (_insert, "chain", "inserted", 3),
    "reorder": (_reorder, "chain", "reordered", 3),
    "truncate": (_truncate, "anchors", "truncated", 1),
    "cut_tail": (_cut_tail, "anchors", "tail_cut", 4),
    "rewrite_and_rehash": (_rewrite_and_rehash, "anchors", "rewritten", 3),
}


def _manage(*argv: str) -> int:
    """As ``manage.py`` runs it, exit status included (it closes the connection: call it last)."""
    try:
        ManagementUtility(["manage.py", *argv]).execute()
    except SystemExit as exit_:
        return exit_.code or 0
    return 0


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_audit_verify_with_anchors_names_each_tampering_and_its_position(kind, capsys):
    tamper, part, problem, position = TAMPERING[kind]
    _write_anchored(6)
    assert verify_all(anchors=True)["ok"]
    with superuser_tampering():
        tamper()
    assert _manage("audit_verify", "--anchors") != 0
    out, err = capsys.readouterr()
    report = json.loads(out.strip().splitlines()[-1])
    assert not report["ok"]
    assert (report[part]["problem"], report[part]["first_broken_seq"]) == (problem, position), (
        report
    )
    assert f"seq {position}" in err and problem in err


@pytest.mark.parametrize("kind", ["truncate", "cut_tail", "rewrite_and_rehash"])
def test_the_chain_alone_is_fooled_by_what_only_the_anchors_catch(kind):
    _write_anchored(6)
    with superuser_tampering():
        TAMPERING[kind][0]()
    assert verify_chain().ok  # why anchors exist
    assert not verify_all(anchors=True)["anchors"]["ok"]


def test_sparse_anchors_bound_a_rewrite_between_the_last_good_anchor_and_the_first_bad_one():
    _write(2)
    write_anchor()
    _write(4)
    write_anchor()  # anchors at seq 2 and seq 6 only
    with superuser_tampering():
        _at(4).update(reason="nothing to see")
        _rehash_from(4)
    report = verify_all(anchors=True)["anchors"]
    assert (report["problem"], report["first_broken_seq"], report["changed_after_seq"]) == (
        "rewritten",
        6,
        2,
    )
    assert "rows 3..6" in report["detail"]


def test_a_cut_tail_followed_by_new_events_is_a_rewrite_at_the_anchored_position():
    _write_anchored(6)
    with superuser_tampering():
        _cut_tail()
    _write(3)  # the application carries on from seq 4: seqs 4..6 exist again, with other hashes
    assert verify_chain().ok
    report = verify_all(anchors=True)["anchors"]
    assert (report["problem"], report["first_broken_seq"], report["changed_after_seq"]) == (
        "rewritten",
        4,
        3,
    )


# --- anchors are written outside the database, append-only, also when idle --------------------------


def test_an_anchor_is_the_signed_head_and_is_appended_also_when_nothing_happened():
    _write(3)
    head = AuditChain.objects.get(key=SYSTEM)
    first = write_anchor()
    second = write_anchor()  # idle: no new event, still a fresh anchor
    assert first["root"] == second["root"] == merkle_root([(SYSTEM, head.seq, head.hash)])
    assert (first["chains"], first["events"]) == (1, 3)
    assert first["heads"] == [[SYSTEM, head.seq, head.hash]]
    assert second["at"] > first["at"]
    lines = _sink_path().read_text().splitlines()
    assert [json.loads(line) for line in lines] == [first, second]
    public = signing_key().public_key()
    public.verify(base64.b64decode(first["sig"]), signed_bytes(first))  # raises if invalid
    report = verify_all(anchors=True)["anchors"]
    assert report["ok"] and report["anchors"] == 2 and report["anchored_events"] == 3


def test_the_sink_only_grows_earlier_lines_are_never_rewritten():
    _write(1)
    write_anchor()
    before = _sink_path().read_bytes()
    _write(2)
    write_anchor()
    write_anchor()
    after = _sink_path().read_bytes()
    assert after.startswith(before) and after.count(b"\n") == 3


def test_the_beat_task_writes_an_anchor_at_the_configured_interval():
    entry = django_settings.CELERY_BEAT_SCHEDULE["audit-anchor"]
    assert entry == {
        "task": "audit.tasks.write_anchor",
        "schedule": django_settings.ANCHOR_INTERVAL_S,
    }
    _write(2)
    record = write_anchor_task.apply().get()
    assert record["events"] == 2 and json.loads(_sink_path().read_text())["events"] == 2


def test_audit_anchor_command_appends_one_and_prints_the_public_key(capsys):
    _write(1)
    call_command("audit_anchor")
    printed = json.loads(capsys.readouterr().out.strip())
    assert printed["events"] == 1 and len(_sink_path().read_text().splitlines()) == 1
    call_command("audit_anchor", "--public-key")
    pem = capsys.readouterr().out
    assert pem.startswith("-----BEGIN PUBLIC KEY-----")
    assert key_id(serialization.load_pem_public_key(pem.encode())) == printed["key"]


def test_no_anchor_for_a_head_the_database_contradicts():
    _write(3)
    with superuser_tampering():
        _set_head(2, _at(2).get().hash)
    with pytest.raises(AnchorRefused):
        write_anchor()
    assert not _sink_path().exists()
    assert "refused" in write_anchor_task.apply().get()  # the beat task logs it and carries on
    assert not _sink_path().exists()


# --- the anchors themselves are checked --------------------------------------------------------------


def test_a_forged_or_edited_anchor_line_is_named_by_its_line():
    _write(3)
    write_anchor()
    good = json.loads(_sink_path().read_text())
    forged = good | {"root": merkle_root([(SYSTEM, 2, _at(2).get().hash)])}  # signed for seq 3
    other_key = Ed25519PrivateKey.generate()
    foreign = good | {"key": key_id(other_key.public_key())}
    foreign["sig"] = base64.b64encode(other_key.sign(signed_bytes(foreign))).decode()
    sink = DirectorySink()
    sink.append(json.dumps(forged))
    sink.append(json.dumps(foreign))
    sink.append("{not json")
    report = verify_all(anchors=True)["anchors"]
    assert not report["ok"]
    assert report["invalid"] == [
        {"line": 2, "problem": "bad_signature"},
        {"line": 3, "problem": "unknown_key"},
        {"line": 4, "problem": "unreadable"},
    ]


def test_verification_keys_can_be_given_as_public_key_files(settings, tmp_path):
    _write(1)
    write_anchor()
    pub = tmp_path / "anchor.pub"
    pub.write_text(public_pem(signing_key().public_key()))
    settings.ANCHOR_SIGNING_KEY = str(tmp_path / "missing.pem")  # the verifier needs no private key
    settings.ANCHOR_VERIFY_KEYS = [str(pub)]
    assert verify_all(anchors=True)["anchors"]["ok"]
    settings.ANCHOR_VERIFY_KEYS = []
    with pytest.raises(Exception, match="no key at"):
        verify_all(anchors=True)


def test_no_anchors_at_all_fails_the_anchor_check():
    _write(2)
    report = verify_all(anchors=True)
    assert report["chain"]["ok"] and not report["ok"]
    assert report["anchors"]["problem"] == "no_anchors"


def test_a_demo_key_is_generated_into_var_once_with_a_log_line(settings, tmp_path, caplog):
    settings.ANCHOR_SIGNING_KEY = ""
    settings.ANCHOR_DEMO_KEY_FILE = str(tmp_path / "var" / "anchor-signing-key.pem")
    with caplog.at_level("WARNING", logger="audit.anchors.signing"):
        first = key_id(signing_key().public_key())
    assert "generated a demo anchor signing key" in caplog.text
    assert key_id(signing_key().public_key()) == first
    settings.PRODUCTION = True
    settings.ANCHOR_DEMO_KEY_FILE = str(tmp_path / "elsewhere.pem")
    with pytest.raises(Exception, match="production needs a provisioned key"):
        signing_key()


# --- each anchor also signs the history heads of the runs that moved --------------------------------


def _history_rehashed_from(run_id: str, seq: int) -> None:
    """Rewrite the run's history from ``seq`` on, recompute every hash and move the run's head: the
    history chain verifies again (the run row holds no secret either)."""
    from runs.integrity import history_fields
    from runs.models import HistoryEvent, Run

    prev = HistoryEvent.objects.get(run_id=run_id, seq=seq - 1).hash
    for event in HistoryEvent.objects.filter(run_id=run_id, seq__gte=seq).order_by("seq"):
        event.prev_hash = prev
        event.hash = link_hash(prev, history_fields(event))
        HistoryEvent.objects.filter(pk=event.pk).update(prev_hash=prev, hash=event.hash)
        prev = event.hash
    Run.objects.filter(pk=run_id).update(history_head=prev)


@contextmanager
def history_triggers_off():
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE refuses with deferred FK checks
        cur.execute("ALTER TABLE runs_historyevent DISABLE TRIGGER ALL")
    yield
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE runs_historyevent ENABLE TRIGGER ALL")


def _anchored_run(worker) -> tuple[str, list[int]]:
    """A run with an anchor after each step; returns its id and the history seqs anchored."""
    from runs.models import Run
    from tests.conftest import claim, declare, start_run

    run = start_run(worker)
    write_anchor()
    claim(worker, run["id"])
    write_anchor()
    declare(worker, run["id"], 1)
    record = write_anchor()
    head = Run.objects.get(pk=run["id"])
    assert [run["id"], head.history_seq, head.history_head] in record["parts"]["runs"]
    seqs = sorted(
        {seq for a in _sink_lines() for r, seq, _ in a["parts"]["runs"] if r == run["id"]}
    )
    return run["id"], seqs


def _sink_lines() -> list[dict]:
    return [json.loads(line) for line in _sink_path().read_text().splitlines()]


def test_a_run_history_rewritten_and_rehashed_head_and_all_is_caught_by_the_anchors(worker):
    run_id, anchored = _anchored_run(worker)
    tampered = anchored[1]  # a history row some anchor signed, not the first
    from runs.models import HistoryEvent

    with history_triggers_off():
        HistoryEvent.objects.filter(run_id=run_id, seq=tampered).update(actor="mallory")
        _history_rehashed_from(run_id, tampered)
    report = verify_all(anchors=True)
    assert report["chain"]["ok"] and report["history"]["ok"]  # the chains alone are fooled
    runs = report["anchors"]["runs"]
    assert not report["ok"] and not runs["ok"]
    assert (runs["problems"][0]["run"], runs["problems"][0]["problem"]) == (run_id, "rewritten")
    assert runs["problems"][0]["first_broken_seq"] == tampered
    assert f"run {run_id} history rewritten at seq {tampered}" in report["anchors"]["summary"]


def test_a_run_history_tail_cut_with_its_head_moved_back_is_caught_by_the_anchors(worker):
    from runs.models import HistoryEvent, Run

    run_id, anchored = _anchored_run(worker)
    last = anchored[-1]
    with history_triggers_off():
        HistoryEvent.objects.filter(run_id=run_id, seq=last).delete()
        before = HistoryEvent.objects.get(run_id=run_id, seq=last - 1)
        Run.objects.filter(pk=run_id).update(history_seq=last - 1, history_head=before.hash)
    report = verify_all(anchors=True)
    assert report["history"]["ok"]
    problem = report["anchors"]["runs"]["problems"][0]
    assert (problem["run"], problem["problem"], problem["first_broken_seq"]) == (
        run_id,
        "cut",
        last,
    )


def test_an_old_newest_anchor_is_stale_and_fails_the_check(settings):
    """Issue 19: a trail that stopped is a failure, not a note (audit/anchors/times.py)."""
    settings.ANCHOR_INTERVAL_S = 60
    _write(1)
    key = signing_key()
    old = {
        "v": 2,
        **current_heads(None),
        "at": "2026-01-01T00:00:00+00:00",
        "key": key_id(key.public_key()),
    }
    old["sig"] = base64.b64encode(key.sign(signed_bytes(old))).decode()
    DirectorySink().append(json.dumps(old))
    report = verify_all(anchors=True)["anchors"]
    assert not report["ok"] and report["stale"] and report["latest_at"].startswith("2026-01-01")
    assert report["problem"] == "anchor_stale"
    write_anchor()
    fresh = verify_all(anchors=True)["anchors"]
    assert not fresh["stale"] and fresh["problem"] == "anchor_missing"  # the event in the hole


# --- per-run chains under the Merkle checkpoint ------------------------------------------------------


def _run_events(run_id, n: int) -> None:
    for i in range(n):
        record_audit(actor=ACTOR, action="test.step", object_type="run", object_id=i, run_id=run_id)


def test_cutting_the_tail_of_one_runs_chain_is_named_with_its_chain_against_the_merkle_anchor():
    import uuid

    busy, quiet = uuid.uuid4(), uuid.uuid4()
    _write(2)
    _run_events(quiet, 3)
    for _ in range(3):
        _run_events(busy, 2)
        write_anchor()
    chain = f"run:{busy}"
    assert AuditChain.objects.get(key=chain).seq == 6
    assert verify_all(anchors=True)["ok"]
    with superuser_tampering():  # the run's last two events go, its head moved back to match
        AuditEvent.objects.filter(chain=chain, chain_seq__gte=5).delete()
        _set_head(4, _at(4, chain).get().hash, chain)
    report = verify_all(anchors=True)
    assert report["chain"]["ok"]  # the chains alone are fooled
    part = report["anchors"]
    assert (part["problem"], part["chain"], part["first_broken_seq"]) == ("tail_cut", chain, 5)
    assert f"tail_cut in chain {chain} at seq 5" in part["summary"]
    assert [p["chain"] for p in part["problems"]] == [chain]  # the other chains still match


def test_rewriting_and_rehashing_one_runs_chain_names_that_chain_only():
    import uuid

    runs = [uuid.uuid4() for _ in range(3)]
    for run_id in runs:
        _run_events(run_id, 4)
    write_anchor()
    chain = f"run:{runs[1]}"
    with superuser_tampering():
        _at(2, chain).update(reason="nothing to see")
        _rehash_from(2, chain)
    report = verify_all(anchors=True)
    assert report["chain"]["ok"]
    part = report["anchors"]
    assert (part["problem"], part["chain"], part["first_broken_seq"]) == ("rewritten", chain, 4)
    assert len(part["problems"]) == 1


@pytest.mark.django_db(transaction=True)
def test_a_deleted_anchor_line_shows_as_a_root_that_does_not_add_up():
    """Committed writes, as in production: each anchor carries only the heads that moved since the
    one before, so a line taken out of the sink leaves the next root unexplained."""
    import uuid

    _write(1)
    first = write_anchor()
    _run_events(uuid.uuid4(), 1)
    second = write_anchor()
    third = write_anchor()  # idle
    assert len(first["heads"]) == 1 and len(second["heads"]) == 1 and third["heads"] == []
    assert verify_all(anchors=True)["ok"]
    lines = _sink_path().read_text().splitlines()
    _sink_path().write_text(lines[0] + "\n" + lines[2] + "\n")  # the new run chain's anchor goes
    report = verify_all(anchors=True)["anchors"]
    assert not report["ok"] and report["problem"] == "anchor_missing"
    assert "line 2" in report["detail"]
