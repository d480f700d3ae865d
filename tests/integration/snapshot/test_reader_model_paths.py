"""The reader model asked the plain way, by a long poll and through a subscription.

docs/design.md §5 "Every path is exact". :class:`PathsReaderModel` is the
state machine of ``test_reader_model`` with the daemon's default
``--verify-interval`` (30 s: verification cannot repair a lost wake-up within a run),
asked as runtimes mostly ask: after each step a plain ``sessions.snapshot``
(no ``max_age_ms``), a ``since`` long poll and a subscriber's state (built
from ``added`` / ``changed`` / ``removed``) must each equal the reference
within :data:`~helpers.asking.SHOWN_WITHIN_S` (a third of the verify
interval: a lost change is not repaired by then). Steps land at random
phases: a random pause before some, none (no wait for the answer) before
others, so that they land while an observation runs. Its own rules: the
home's mode and owner loosened and made strict again (the answer is then
``unavailable`` with a gap that says how to fix it), store writes from a
kept-open connection (some stalled between their WAL write and their
publication, as a slow disk would), WAL checkpoints, and a store replaced by
another file. The hard-link rule is left out: only verification sees it.

Verification must find nothing the watch missed (``changes_found`` stays 0).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path

import pytest
from helpers.asking import Asking, View
from helpers.kept_writer import KeptWriter
from helpers.reliability import size
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from models.reader_model import Expected, reference, sample_processes
from test_reader_model import EXEC_IDS, INPUTS, PICK, SESSIONS, ReaderModel, changes_found

PAUSES_S = (0.0, 0.0, 0.001, 0.005, 0.02, 0.1, 0.3)
LOOSE_MODES = (0o777, 0o720, 0o702)
NOBODY = 65534


def _gap_paths(view: View, home: Path) -> set[str]:
    prefix = f"{home}{os.sep}"
    return {gap.split(": ", 1)[0] for gap in view.gaps if gap.startswith(prefix)}


def _store_missing(view: View) -> bool:
    return any("does not exist; nobody owns anything" in gap for gap in view.gaps)


def home_is_loose(home: Path) -> bool:
    """Whether the home breaks the strictness rule (docs/design.md §3): group or others
    may write it, or another user owns it."""
    st_home = os.stat(home)
    return bool(st_home.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or st_home.st_uid != os.geteuid()


def matches(view: View, expected: Expected, home: Path, loose: bool) -> bool:
    """Whether ``view`` says what the reference says (a loose home: refused, with the fix)."""
    if loose:
        return view.discovery == "unavailable" and any("Fix:" in gap for gap in view.gaps)
    sessions = {sid: (ctx, tuple(keys)) for sid, (ctx, keys) in expected.sessions.items()}
    return (
        view.discovery == "ready"
        and view.sessions == sessions
        and view.unowned == tuple(expected.unowned)
        and _gap_paths(view, home) == expected.broken
        and _store_missing(view) == (not expected.store_exists)
    )


class PathsReaderModel(ReaderModel):
    """The reader model, asked the plain way, by a long poll and by a subscription."""

    rewrite_through_hard_link = None  # not a rule here: only verification sees it

    def __init__(self) -> None:
        super().__init__()
        self.asking = Asking(self.daemon.socket_path)
        self.asking.start()
        self.unchecked = 0  # checks to skip: the next step lands without waiting
        self.writer: KeptWriter | None = None
        self.writer_inode: int | None = None

    def daemon_args(self) -> list[str]:
        return ["--watch", self.watch]  # the default --verify-interval

    def teardown(self) -> None:
        if hasattr(self, "asking"):
            self.asking.close()
        if getattr(self, "writer", None) is not None:
            assert self.writer is not None
            self.writer.close()
        super().teardown()

    # -- phases ----------------------------------------------------------------

    @rule(seconds=st.sampled_from(PAUSES_S))
    def pause(self, seconds: float) -> None:
        """Nothing changes for a while: the next step lands at another phase."""
        time.sleep(seconds)

    @rule()
    def no_wait(self) -> None:
        """The next step follows at once, while the observation of this one may run."""
        self.unchecked = 2  # this check (nothing changed) and the next step's

    # -- the home's strictness ---------------------------------------------------

    @rule(how=st.sampled_from((*LOOSE_MODES, "chown")))
    def loosen_home(self, how: int | str) -> None:
        if how == "chown":
            if os.geteuid() == 0:  # chown to another user needs root
                os.chown(self.home, NOBODY, -1)
        else:
            assert isinstance(how, int)
            os.chmod(self.home, how)

    @rule()
    def tighten_home(self) -> None:
        os.chown(self.home, os.geteuid(), -1)
        os.chmod(self.home, 0o700)

    # -- the store from a kept-open connection ---------------------------------

    def kept(self) -> KeptWriter | None:
        """The writer with a kept-open connection to the store at the path now, or None
        while there is no store (connecting would make an empty one)."""
        path = self.home / "capsule.db"
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            return None
        if self.writer is not None and self.writer_inode != inode:
            self.writer.close()  # the store it held was removed or replaced
            self.writer = None
        if self.writer is None:
            self.writer = KeptWriter(path)
            self.writer_inode = inode
        return self.writer

    @rule(
        key=st.sampled_from((*INPUTS, "inp_c", *EXEC_IDS)),
        session_id=st.sampled_from((*SESSIONS, None)),
        stall=st.booleans(),
    )
    def kept_own(self, key: str, session_id: str | None, stall: bool) -> None:
        """An input or exec owned by a session (None: owned by none), from the kept connection."""
        writer = self.kept()
        if writer is None:
            return
        table, column = (
            ("session_execs", "exec_id")
            if key.startswith("exe_")
            else (
                "session_inputs",
                "input_id",
            )
        )
        if session_id is None:
            writer.write(f"DELETE FROM {table} WHERE {column} = ?", (key,), stall=stall)
        else:
            sql = f"INSERT OR REPLACE INTO {table} ({column}, session_id) VALUES (?, ?)"
            writer.write(sql, (key, session_id), stall=stall)

    @rule(who=PICK, session_id=st.sampled_from((*SESSIONS, None)), stall=st.booleans())
    def kept_process(self, who: int, session_id: str | None, stall: bool) -> None:
        writer = self.kept()
        if writer is None:
            return
        pid, start = self.pid_of(who)
        if session_id is None:
            writer.write("DELETE FROM session_processes WHERE pid = ?", (pid,), stall=stall)
        else:
            sql = (
                "INSERT OR REPLACE INTO session_processes (pid, started_at, session_id)"
                " VALUES (?, ?, ?)"
            )
            writer.write(sql, (pid, round(start), session_id), stall=stall)

    @rule()
    def checkpoint(self) -> None:
        """The WAL copied into the database and emptied."""
        writer = self.kept()
        if writer is not None:
            writer.write("PRAGMA wal_checkpoint(TRUNCATE)", ())

    @rule(pick=PICK)
    def replace_store(self, pick: int) -> None:
        """A copy of the store with one row less, renamed over it."""
        path = self.home / "capsule.db"
        if not path.exists():
            return
        copy = self.home / ".capsule.db.new"
        source = sqlite3.connect(path, timeout=5)
        target = sqlite3.connect(copy)
        try:
            source.backup(target)
            rows = list(target.execute("SELECT rowid FROM session_inputs ORDER BY rowid"))
            if rows:
                target.execute("DELETE FROM session_inputs WHERE rowid = ?", rows[pick % len(rows)])
                target.commit()
            target.execute("PRAGMA journal_mode = WAL")
        finally:
            target.close()
            source.close()
        os.rename(copy, path)
        for suffix in ("-wal", "-shm"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)

    # -- the check after every step --------------------------------------------

    def expected_now(self) -> Expected:
        """The reference, taken again while a pid it names was reused meanwhile."""
        for _ in range(5):
            before = sample_processes()
            expected = reference(self.home)
            if all(before.get(pid) == expected.sample.get(pid) for pid in expected.named_pids):
                break
        return expected

    @invariant()
    def snapshot_equals_reference(self) -> None:
        if self.unchecked:
            self.unchecked -= 1
            return
        loose = home_is_loose(self.home)
        expected = self.expected_now()
        try:
            self.asking.expect(lambda view: matches(view, expected, self.home, loose))
        except AssertionError:
            expected = self.expected_now()  # a process the reference sampled may have moved
            self.asking.expect(
                lambda view: matches(view, expected, self.home, loose),
                within_s=0.1,
                what=f"the step (expected {expected.sessions}, unowned {expected.unowned})",
            )
        assert changes_found(self.client) == 0, self.missed_lines()


class PolledPathsReaderModel(PathsReaderModel):
    """The same, with the daemon's own ``lstat`` poller (its latency: the poll interval)."""

    watch = "polling"


PathsReaderModel.TestCase.settings = settings(
    max_examples=size(3, 40),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PolledPathsReaderModel.TestCase.settings = settings(
    PathsReaderModel.TestCase.settings, max_examples=size(2, 20)
)
#: The full run (``CAPSULED_HARDENING_FULL=1``) takes minutes, not the suite's 60 s.
_TIMEOUT = pytest.mark.timeout(size(300, 3600))
TestPathsReaderModel = _TIMEOUT(PathsReaderModel.TestCase)
TestPolledPathsReaderModel = _TIMEOUT(PolledPathsReaderModel.TestCase)


# The many-example runs draw the same examples every time (derandomized), so a
# red CI is a change's doing, not a draw's; the suite's few examples are drawn
# anew each run.
class ManyPathsReaderModel(PathsReaderModel):
    """The same model with many more examples: ``make test-slow`` (and CI) runs it."""


class ManyPolledPathsReaderModel(PolledPathsReaderModel):
    """The polled model with many more examples (``make test-slow``)."""


ManyPathsReaderModel.TestCase.settings = settings(
    PathsReaderModel.TestCase.settings, max_examples=60, derandomize=True
)
ManyPolledPathsReaderModel.TestCase.settings = settings(
    PathsReaderModel.TestCase.settings, max_examples=30, derandomize=True
)
_SLOW_TIMEOUT = pytest.mark.timeout(1200)
TestManyPathsReaderModel = pytest.mark.slow(_SLOW_TIMEOUT(ManyPathsReaderModel.TestCase))
TestManyPolledPathsReaderModel = pytest.mark.slow(
    _SLOW_TIMEOUT(ManyPolledPathsReaderModel.TestCase)
)
