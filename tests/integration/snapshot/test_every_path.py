"""Every path is exact: each change shows in plain snapshots, long polls and subscriptions.

docs/design.md §5 "Every path is exact": a receipt, a store commit (from a
kept-open connection or a new one, before or after a WAL checkpoint, a
store replaced), an exit and the home's mode or owner each show in the next
plain ``sessions.snapshot`` (default ``max_age_ms``), ``since`` long poll and
subscription notification (within ``SHOWN_WITHIN_S``, a third of the verify
interval), wherever the change lands relative to an observation in flight.
The daemon runs with its default ``--verify-interval`` (30 s): verification
cannot repair what a lost wake-up would leave wrong within these tests.

The changes are toggles (a row deleted, inserted, deleted, ...) at random
pauses; some are made right after a change the answer does not show (a
stale receipt rewritten), so that an observation is running when they land.
The seed is in each failure's message.

A commit is heard (its WAL write) before it can be read (its index is
published after the WAL is synced): a lost wake-up hides in that window,
which a disk's sync makes a few milliseconds long only now and then. So
some commits from the kept-open connection (a writer process of its own)
are *stalled* there: the test hears the WAL write too and stops the writer
(``SIGSTOP``) for a while before its commit is published, as a slow disk would.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from helpers.asking import Asking, View, asking
from helpers.daemon import DaemonProcess, short_tmpdir
from helpers.kept_writer import KeptWriter
from helpers.processes import Sleepers
from helpers.reliability import FULL

from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import (
    exec_receipt_path,
    process_start_time,
    write_exec_receipt,
    write_provider_client_receipt,
)
from capsule_client.kit.store import OwnershipStore

#: Toggles per test, and the longest random pause before each, seconds (the
#: full run: the pauses of the report that found the lost wake-up).
TOGGLES: Final = 40
MAX_PAUSE_S: Final = 2.5 if FULL else 0.2
#: A pid that never runs: above the largest pid_max Linux allows.
NEVER_PID: Final = 4_194_311
NOBODY: Final = 65534


class Home:
    """A home with a live receipt of each kind, the store, and the daemon serving it."""

    def __init__(self, root: Path, sleeper: subprocess.Popen[bytes], mode: str) -> None:
        self.home = root / "home"
        self.home.mkdir(mode=0o700)
        self.pid = sleeper.pid
        self.start_s = process_start_time(sleeper.pid)
        write_provider_client_receipt(
            self.home, "r1", "inp_a", "c1", self.pid, started_at_s=self.start_s
        )
        write_exec_receipt(self.home, "exe_a", self.pid, started_at_s=self.start_s)
        with OwnershipStore(store_path(self.home)) as store:
            for session in ("ses_in", "ses_ex", "ses_pr", "ses_rc"):
                store.register_session(session, context_id=f"ctx_{session}")
        self.daemon = DaemonProcess(
            self.home, root / "e.sock", ["--watch", mode, "--log-level", "info"]
        )
        self.daemon.start()
        try:
            self.kept = KeptWriter(store_path(self.home))
        except BaseException:
            self.daemon.__exit__()
            raise

    def close(self) -> None:
        self.kept.close()
        self.daemon.__exit__()

    def write(self, sql: str, args: tuple[object, ...], rng: random.Random) -> None:
        """One commit: mostly from the kept-open connection (half of those stalled),
        sometimes from a new one, sometimes followed by a checkpoint that empties the WAL."""
        if rng.random() < 0.25:
            with sqlite3.connect(store_path(self.home), timeout=5, isolation_level=None) as db:
                db.execute(sql, args)
            db.close()
        else:
            assert self.kept.write(sql, args, stall=rng.random() < 0.5) == b"ok"
        if rng.random() < 0.2:
            assert self.kept.write("PRAGMA wal_checkpoint(TRUNCATE)", ()) == b"ok"

    def noise(self) -> None:
        """A change the answer does not show: a stale exec receipt rewritten (an observation
        then runs while the next change lands)."""
        write_exec_receipt(self.home, "exe_stale", NEVER_PID, started_at_s=time.time())


@pytest.fixture
def sleeper(pool: Sleepers) -> subprocess.Popen[bytes]:
    return pool.start()


@pytest.fixture(params=["native", "polling"])
def served(request: pytest.FixtureRequest, sleeper: subprocess.Popen[bytes]) -> Iterator[Home]:
    with short_tmpdir() as root:
        home = Home(root, sleeper, str(request.param))
        try:
            yield home
        finally:
            home.close()


@pytest.fixture
def native(sleeper: subprocess.Popen[bytes]) -> Iterator[Home]:
    with short_tmpdir() as root:
        home = Home(root, sleeper, "native")
        try:
            yield home
        finally:
            home.close()


def toggle(
    home: Home,
    paths: Asking,
    change: Callable[[bool, random.Random], None],
    shown: Callable[[View, bool], bool],
    what: str,
) -> None:
    """:data:`TOGGLES` changes at random phases, each shown on every path."""
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    on = shown(paths.expect(lambda view: view.discovery == "ready", what="ready"), True)
    for n in range(TOGGLES):
        time.sleep(rng.uniform(0, MAX_PAUSE_S))
        if rng.random() < 0.3:
            home.noise()
        on = not on
        change(on, rng)
        paths.expect(
            lambda view, on=on: view.discovery == "ready" and shown(view, on),
            what=f"{what} #{n} ({'on' if on else 'off'}, seed {seed})",
        )


@pytest.mark.parametrize("table", ["session_inputs", "session_execs", "session_processes"])
def test_store_rows_toggled_at_random_phases_show_on_every_path(native: Home, table: str) -> None:
    home = native
    session, key = {
        "session_inputs": ("ses_in", "inp_a"),
        "session_execs": ("ses_ex", "exe_a"),
        "session_processes": ("ses_pr", None),
    }[table]

    def change(on: bool, rng: random.Random) -> None:
        if table == "session_processes":
            if on:
                sql = "INSERT INTO session_processes (pid, started_at, session_id) VALUES (?, ?, ?)"
                home.write(sql, (home.pid, round(home.start_s), session), rng)
            else:
                home.write("DELETE FROM session_processes WHERE pid = ?", (home.pid,), rng)
        elif on:
            home.write(f"INSERT INTO {table} VALUES (?, ?)", (key, session), rng)
        else:
            column = "input_id" if table == "session_inputs" else "exec_id"
            home.write(f"DELETE FROM {table} WHERE {column} = ?", (key,), rng)

    def shown(view: View, on: bool) -> bool:
        return (session in view.sessions) == on

    with asking(home.daemon.socket_path) as paths:
        toggle(home, paths, change, shown, table)
    assert home.kept.stalls > 0, "no commit was stalled: the window was not tried"


def test_a_receipt_toggled_at_random_phases_shows_on_every_path(native: Home) -> None:
    home = native
    with OwnershipStore(store_path(home.home)) as store:
        store.register_exec("exe_r", "ses_rc")
    path = exec_receipt_path(home.home, "exe_r")

    def change(on: bool, rng: random.Random) -> None:
        if on:
            write_exec_receipt(home.home, "exe_r", home.pid, started_at_s=home.start_s)
        else:
            path.unlink()

    with asking(home.daemon.socket_path) as paths:
        toggle(home, paths, change, lambda view, on: ("ses_rc" in view.sessions) == on, "receipt")


def test_a_replaced_store_and_exits_show_on_every_path(native: Home, pool: Sleepers) -> None:
    home = native
    with asking(home.daemon.socket_path) as paths:
        for n in range(5):
            # A new store with another owner, renamed over the one the daemon holds open.
            fresh = home.home / f".new-{n}.db"
            with OwnershipStore(fresh) as store:
                store.register_session(f"ses_new{n}")
                store.register_input("inp_a", f"ses_new{n}")
            os.rename(fresh, store_path(home.home))
            for suffix in ("-wal", "-shm"):
                Path(f"{fresh}{suffix}").unlink(missing_ok=True)
            paths.expect(lambda view, n=n: f"ses_new{n}" in view.sessions, what=f"store {n}")
            # A process owned by a row exits.
            process = pool.start()
            with OwnershipStore(store_path(home.home)) as store:
                store.register_process(process.pid, f"ses_new{n}")
            paths.expect(lambda view, p=process.pid: view.owner_of(p) is not None, what="row")
            pool.kill(process, reap=n % 2 == 0)
            paths.expect(lambda view, p=process.pid: view.owner_of(p) is None, what="exit")


def _refused(view: View) -> bool:
    return view.discovery == "unavailable" and any("Fix:" in gap for gap in view.gaps)


def test_the_home_made_loose_and_strict_again_shows_on_every_path(served: Home) -> None:
    home = served
    with asking(home.daemon.socket_path) as paths:
        paths.expect(lambda view: view.discovery == "ready", what="ready at start")
        for mode in (0o777, 0o720, 0o702):
            os.chmod(home.home, mode)
            view = paths.expect(_refused, what=f"mode {mode:04o} refused")
            assert any(f"chmod 0700 {home.home}" in gap for gap in view.gaps), view.gaps
            os.chmod(home.home, 0o700)
            paths.expect(lambda view: view.discovery == "ready", what=f"ready after {mode:04o}")
        if os.geteuid() == 0:  # chown to another user needs root
            os.chown(home.home, NOBODY, -1)
            view = paths.expect(_refused, what="another owner refused")
            assert any("is owned by uid 65534" in gap for gap in view.gaps), view.gaps
            os.chown(home.home, os.geteuid(), -1)
            paths.expect(lambda view: view.discovery == "ready", what="ready after chown")
            assert home.daemon.process is not None and home.daemon.process.poll() is None
