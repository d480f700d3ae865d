"""The real daemon judges receipts and rows by their exact identity (docs/design.md §3, §4, §14).

What a clock step leaves behind is made as it would be: receipts and rows
whose ``started_at`` is a step away from what the kernel's boot time gives
today, with the boot id and start ticks of their process. The daemon lists
them, names their argv and signals them; the same ticks under another boot
id are no process of this boot. A store of version 1 is read, its rows by
their tolerance; one a newer kit wrote is refused with what to do.
"""

from __future__ import annotations

import signal
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import DEADLINE_S, Processes

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.proc import ProcessStart, process_start
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the exact identity is Linux's"
)

STEP_S = 90
OTHER_BOOT = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with Client(daemon.socket_path, timeout_s=30.0) as connected:
        yield connected
    assert daemon.process is not None and daemon.process.poll() is None, "the daemon died"


def stepped(pid: int, seconds: float, boot_id: str | None = None) -> ProcessStart:
    """The start of ``pid`` as recorded ``seconds`` of clock step ago (in ``boot_id``)."""
    start = process_start(pid)
    return ProcessStart(start.started_at_s + seconds, boot_id or start.boot_id, start.start_ticks)


def listed(snapshot: ActiveSessionsSnapshot) -> dict[int, tuple[str, str, int]]:
    """pid → (session or "unowned", kind, started_at) of every process listed."""
    found = {
        p.pid: (s.session_id, p.kind, p.started_at) for s in snapshot.sessions for p in s.processes
    }
    found.update({p.pid: ("unowned", p.kind, p.started_at) for p in snapshot.unowned})
    return found


def test_claims_a_step_away_are_listed_named_and_signalled(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    before, after, row = procs.sleep(), procs.sleep(), procs.sleep()
    starts = {
        before.pid: stepped(before.pid, -STEP_S),
        after.pid: stepped(after.pid, STEP_S),
        row.pid: stepped(row.pid, -STEP_S),
    }
    home = daemon.home
    write_provider_client_receipt(home, "r", "inp_a", "c", before.pid, start=starts[before.pid])
    write_exec_receipt(home, "exe_a", after.pid, start=starts[after.pid])
    with OwnershipStore(store_path(home)) as store:
        store.register_session("ses_a")
        store.register_input("inp_a", "ses_a")
        store.register_exec("exe_a", "ses_a")
        store.register_process(row.pid, "ses_a", start=starts[row.pid])

    snapshot = client.snapshot(fresh=True, commands=True)
    assert snapshot.discovery == "ready", snapshot.gaps
    assert listed(snapshot) == {
        before.pid: ("ses_a", "provider_client", round(starts[before.pid].started_at_s)),
        after.pid: ("ses_a", "exec", round(starts[after.pid].started_at_s)),
        row.pid: ("ses_a", "process", round(starts[row.pid].started_at_s)),
    }
    commands = {p.pid: p.command for p in snapshot.sessions[0].processes}
    assert commands == {pid: ["sleep", "300"] for pid in starts}

    report = client.terminate("ses_a", grace_s=DEADLINE_S)
    assert {p.pid: p.outcome for p in report.processes} == dict.fromkeys(starts, "exited")
    for process in (before, after, row):
        assert process.wait(timeout=DEADLINE_S) == -signal.SIGTERM


def test_the_right_ticks_under_another_boot_id_are_no_process_of_this_boot(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    receipt, row, control = procs.sleep(), procs.sleep(), procs.sleep()
    home = daemon.home
    write_exec_receipt(home, "exe_old", receipt.pid, start=stepped(receipt.pid, 0, OTHER_BOOT))
    write_exec_receipt(home, "exe_now", control.pid)
    with OwnershipStore(store_path(home)) as store:
        store.register_session("ses_a")
        store.register_exec("exe_old", "ses_a")
        store.register_process(row.pid, "ses_a", start=stepped(row.pid, 0, OTHER_BOOT))
    snapshot = client.snapshot(fresh=True)
    assert snapshot.discovery == "ready", snapshot.gaps
    assert set(listed(snapshot)) == {control.pid}  # the control shows the receipts were read


def make_v1_store(path: Path, rows: list[tuple[int, int]]) -> None:
    """A store of user_version 1, by the SQL its writers ran, owning ``rows`` (pid, start)."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.executescript(
            """
            PRAGMA journal_mode = WAL;
            BEGIN;
            CREATE TABLE sessions (session_id TEXT PRIMARY KEY, context_id TEXT, title TEXT,
                                   created_at INTEGER NOT NULL);
            CREATE TABLE session_inputs (input_id TEXT PRIMARY KEY,
                                         session_id TEXT NOT NULL REFERENCES sessions);
            CREATE TABLE session_execs (exec_id TEXT PRIMARY KEY,
                                        session_id TEXT NOT NULL REFERENCES sessions);
            CREATE TABLE session_processes (pid INTEGER NOT NULL, started_at INTEGER NOT NULL,
                                            session_id TEXT NOT NULL REFERENCES sessions,
                                            PRIMARY KEY (pid, started_at));
            INSERT INTO sessions VALUES ('ses_v1', NULL, NULL, 1700000000);
            PRAGMA user_version = 1;
            COMMIT;
            """
        )
        with raw:
            raw.executemany("INSERT INTO session_processes VALUES (?, ?, 'ses_v1')", rows)
    finally:
        raw.close()


def test_a_version_1_store_is_read_its_rows_by_their_tolerance(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    near, far = procs.sleep(), procs.sleep()
    make_v1_store(
        store_path(daemon.home),
        [
            (near.pid, round(process_start(near.pid).started_at_s) + 2),
            (far.pid, round(process_start(far.pid).started_at_s) + STEP_S),
        ],
    )
    snapshot = client.snapshot(fresh=True)
    assert snapshot.discovery == "ready", snapshot.gaps
    assert {pid: kind for pid, (_, kind, _) in listed(snapshot).items()} == {near.pid: "process"}

    # A runtime's kit opens it while the daemon runs: migrated, and its new row, a step
    # away with its identity, is read through the connection the daemon kept open.
    later = procs.sleep()
    with OwnershipStore(store_path(daemon.home)) as store:
        store.register_process(later.pid, "ses_v1", start=stepped(later.pid, STEP_S))
    snapshot = client.snapshot(fresh=True)
    assert snapshot.discovery == "ready", snapshot.gaps
    assert set(listed(snapshot)) == {near.pid, later.pid}


def test_a_store_a_newer_kit_wrote_is_unavailable_with_what_to_do(
    daemon: DaemonProcess, client: Client
) -> None:
    db = store_path(daemon.home)
    with OwnershipStore(db) as store:
        store.register_session("ses_a")
    raw = sqlite3.connect(db)
    try:
        raw.execute("PRAGMA user_version = 3")
    finally:
        raw.close()
    snapshot = client.snapshot(fresh=True)
    assert snapshot.discovery == "unavailable"
    (gap,) = snapshot.gaps
    assert "user_version 3, newer than this capsuled reads user_version 1 to 2" in gap
    assert "upgrade capsuled" in gap
    assert daemon.process is not None and daemon.process.poll() is None
