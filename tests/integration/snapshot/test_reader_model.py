"""The daemon's snapshot against a slow, from-scratch reference, step by step.

A hypothesis state machine applies random file-system, process and store
operations to a real home served by a real ``capsuled``; after every step a
read-your-writes snapshot (``max_age_ms: 0``) must equal what
:func:`reference` computes (tests/models/reader_model.py). The reference shares
no code with the daemon: it walks the home with ``os.lstat`` / ``os.scandir``
and never follows a symlink,
parses receipts with :mod:`json`, decides liveness from ``/proc/<pid>/stat``
start times (5 s for provider clients, 3 s for exec receipts and owned
processes), reads the store with :mod:`sqlite3` and projects sessions itself.
The writer kit is used only to write, never to compute an expected answer.

What is compared, and why:

* each active session's context id and the multiset of its processes as
  (kind, pid, started_at, receipt path, input id or exec id); the unowned
  receipts the same way; ``discovery == "ready"`` (nothing moves while the
  test asks, so "scanning" would be wrong).
* gaps loosely: the set of paths under the home that the gaps name must be
  the set of broken receipt paths (not JSON, invalid, a symlink, a FIFO, a
  directory, over 64 KiB), of ``runs`` and ``runtime/exec-processes`` when
  they are symlinks, and of the input directories whose name is not an input
  id that hold a live receipt. Wording is not compared; that the store is
  missing is compared as one flag.
* ``status.verification.changes_found`` (changes the watch did not report,
  found by the net under it) must not move, except across a rewrite through
  a hard link outside the home, which no watch can see. A verification run
  may land between a step and its snapshot and repair what the watch
  missed; this count still tells.

Hard links: the daemon runs with a short ``--verify-interval`` (and the
per-step equality is checked at every step, hard-link steps included). The
rule that rewrites a receipt through a link outside the home waits until two
verification runs have ended, the second begun after the write; the
snapshot then must be right again. Only receipts the daemon keeps (live or
broken ones) and inodes with no receipt name in the home are rewritten that
way: verification re-checks the receipts it keeps, and its cost must not
grow with stale receipts (valid, pid not running), so a stale receipt made
live through a hard link stays unseen until the next walk from scratch. That
is the documented trade-off, exercised by
:func:`test_a_stale_receipt_made_live_through_a_hard_link_waits_for_a_walk`.

No flakes by construction: every start time written is the process's own or
offset by 2, 4 or 100 s, at least 0.5 s from each tolerance once rounded to
whole seconds; the pid that is never running is above any ``pid_max``; a
named pid whose start time differs between two looks at ``/proc`` (a pid
the machine reused meanwhile) makes the step be compared again. The sleep
processes have no children and lead no Unix session, so no process is a
descendant.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
from helpers.daemon import DaemonProcess
from helpers.reliability import size
from helpers.waits import wait_until
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from models.reader_model import (
    INPUT_ID,
    MAX_RECEIPT_BYTES,
    Expected,
    ProcessKey,
    _is_real_dir,
    _lstat,
    _names,
    receipt_places,
    reference,
    sample_processes,
)

from capsule_client import Client
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot, SessionProcess

# ---------------------------------------------------------------------------
# Small pools of names, so that operations collide

RUNS = ("r1", "r2")
INPUTS = ("inp_a", "inp_b", "x_bad")  # x_bad is not an input id
CLIENTS = ("c1", "c2")
EXEC_FILES = ("exe_1", "exe_2", "exe_3")
EXEC_IDS = ("exe_1", "exe_2", "exe_3")
SESSIONS = ("ses_1", "ses_2", "ses_3")
CONTEXTS = (None, "ctx_1", "ctx_2")
#: Receipt start-time offsets, seconds: live for both kinds (0, 2), live only
#: for provider clients (4), never live (+-100). Mostly the process's own.
OFFSETS = (0, 0, 0, 0, 2, 4, 100, -100)
#: Owned-process row offsets: live (0, 2), not live (4, 100).
ROW_OFFSETS = (0, 2, 4, 100)
CONTENTS = (*("valid",) * 5, "unknown_field", "garbage", "schema_2", "pid_1", "huge")
RENAME_NAMES = ("c1.json", "c2.json", "exe_1.json", "exe_2.json", "note.txt", ".hidden.json")
LINK_NAMES = ("cwd", "link.json", "provider-clients", "inp_a", "c1.json", "exec-processes", "runs")
LINK_TARGETS = (
    "home",
    "runs",
    "exec_dir",
    "a_dir",
    "a_receipt",
    "itself",
    "parent",
    "dangling",
    "outside",
)
SPECIAL_NAMES = ("c1.json", "c3.json", "exe_1.json", "exe_4.json")
TABLES = ("sessions", "session_inputs", "session_execs", "session_processes")
#: A pid that never runs: above the largest pid_max Linux allows (2**22).
NEVER_PID = 4_194_311
MAX_SLEEPERS = 6
VERIFY_INTERVAL_S = 0.1
PICK = st.integers(min_value=0, max_value=11)
#: Whether each step checks that verification found nothing the watch missed
#: (no step makes a change the watch cannot see, except the hard-link rewrite,
#: which is checked apart). Two causes of false counts are fixed: a directory
#: listed again from its parent's stale listing (its own test in
#: tests/reader/test_reader_verify.py), and an in-place rewrite read by
#: verification while ``open(O_TRUNC)`` ran (a ``stat`` then sees the new size
#: with the old stamps, which dated the change before the barrier), with the
#: poller's same-tick rewrites (tests/watch/test_polling.py). So is one true
#: miss of the poller: a receipt the reader read after a look and that went
#: before the next look, which only verification dropped
#: (tests/watch/test_polling_reader.py). ``missed_lines`` shows what the
#: daemon logged.
CHECK_MISSED = True


def start_of(pid: int) -> float:
    start = sample_processes().get(pid)
    assert start is not None, f"process {pid} is not running"
    return start


# ---------------------------------------------------------------------------
# What the daemon said, in the same terms


def _text(value: str | msgspec.UnsetType) -> str:
    return "" if isinstance(value, msgspec.UnsetType) else value


def listed(process: SessionProcess) -> ProcessKey:
    key = _text(process.input_id) or _text(process.exec_id)
    return (process.kind, process.pid, process.started_at, _text(process.receipt), key)


def sessions_of(snapshot: ActiveSessionsSnapshot) -> dict[str, tuple[str | None, list[ProcessKey]]]:
    return {
        session.session_id: (session.context_id, sorted(map(listed, session.processes)))
        for session in snapshot.sessions
    }


def gap_paths(snapshot: ActiveSessionsSnapshot) -> set[str]:
    """The paths under the home that the gaps name (``<path>: <why>``)."""
    prefix = snapshot.home + os.sep
    return {gap.split(": ", 1)[0] for gap in snapshot.gaps if gap.startswith(prefix)}


def store_missing(snapshot: ActiveSessionsSnapshot) -> bool:
    return any("does not exist; nobody owns anything" in gap for gap in snapshot.gaps)


# ---------------------------------------------------------------------------
# Writing receipts by hand (the writer kit is used beside these)


def rfc3339(start_s: float) -> str:
    return datetime.fromtimestamp(start_s, UTC).isoformat()


def _finish(doc: dict[str, Any], content: str) -> bytes:
    if content == "unknown_field":
        doc["future"] = {"nested": [1, 2]}
    elif content == "schema_2":
        doc["schema_version"] = 2
    elif content == "pid_1":
        doc["pid"] = 1
    elif content == "huge":
        doc["padding"] = "x" * (MAX_RECEIPT_BYTES + 1000)
    data = json.dumps(doc).encode()
    return data[: len(data) // 2] if content == "garbage" else data


def provider_body(pid: int, start_s: float, content: str = "valid") -> bytes:
    doc = {"schema_version": 1, "pid": pid, "started_at": rfc3339(start_s), "provider": "p"}
    return _finish(doc, content)


def exec_body(exec_id: str, pid: int, start_s: float, content: str = "valid") -> bytes:
    doc = {
        "schema_version": 1,
        "exec_id": exec_id,
        "pid": pid,
        "started_at": round(start_s),
        "command": "sleep 300",
    }
    return _finish(doc, content)


def write_atomically(path: Path, data: bytes) -> None:
    """A hidden temp file beside ``path``, then ``rename``; nothing if that cannot be done."""
    tmp = path.with_name(f".{path.name}.model.tmp")
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        tmp.write_bytes(data)
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # e.g. a symlink loop on the way
            tmp.unlink()


def write_in_place(path: Path, data: bytes) -> None:
    """Truncate and write ``path`` itself (never through a symlink, never a FIFO)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        fd = os.open(path, flags, 0o600)
    except OSError:
        return  # a symlink, a FIFO, a directory, or no directory to put it in
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _rename(source: Path, target: Path) -> None:
    if source == target:
        return
    try:
        os.rename(source, target)
    except OSError:
        pass  # onto a non-empty directory, a directory onto a file, into itself


def _remove(path: Path) -> None:
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _pick(items: list[Any], pick: int) -> Any:
    return items[pick % len(items)] if items else None


def runs_of(client: Client) -> int:
    """Verification runs ended so far."""
    verification = client.status().verification
    assert verification is not None
    return verification.runs


class VerificationReads:
    """What inotify reports of the daemon reading ``exec_dir``, from the moment this is made.

    A cookie in the home begins a verification run (its barrier); ``exec_dir``
    read as a directory is a listing of it; a receipt read after either is a
    pass at work. Only what is closed without a write counts: the test's own
    writes are never taken for the daemon's reads. Make it before the run to
    catch can begin: a run that began before it, however little before, is
    not seen, and the next one may have nothing left to read.
    """

    def __init__(self, home: Path, exec_dir: Path) -> None:
        inotify_simple = pytest.importorskip("inotify_simple")
        self._inotify = inotify_simple.INotify()
        self._inotify.add_watch(home, inotify_simple.flags.CREATE)
        self._inotify.add_watch(exec_dir, inotify_simple.flags.CLOSE_NOWRITE)
        self._exec_dir = exec_dir

    def __enter__(self) -> VerificationReads:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._inotify.close()

    def reading(self, after: Literal["cookie", "listing"]) -> None:
        """Return once a receipt of ``exec_dir`` is read after a ``"cookie"`` or after a
        ``"listing"`` of ``exec_dir``, both reported since this was made."""
        begun = False
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, (
                f"no receipt of {self._exec_dir} read after a {after}"
            )
            for event in self._inotify.read(timeout=100):
                if begun and event.name.endswith(".json"):
                    return
                if after == "cookie":
                    begun |= event.name.startswith(".capsuled-cookie-")
                else:
                    begun |= event.name == ""  # the directory itself: listed


def changes_found(client: Client) -> int:
    """Changes the watch had not reported, found by verification so far."""
    verification = client.status().verification
    assert verification is not None
    return verification.changes_found


# ---------------------------------------------------------------------------
# The state machine


class ReaderModel(RuleBasedStateMachine):
    """One real daemon per run, on a fresh home; the reference checks every step."""

    watch = "native"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="cap", dir="/tmp")).resolve()
        self.home = self.tmp / "home"
        self.home.mkdir(mode=0o700)
        self.outside = self.tmp / "out"
        for name in ("park", "links", "loose"):
            (self.outside / name).mkdir(parents=True)
        self.sleepers: list[subprocess.Popen[bytes]] = []
        self.zombies: list[subprocess.Popen[bytes]] = []
        self.starts: dict[int, float] = {}
        self.dead: list[int] = []
        self.numbers = iter(range(1, 1_000_000))
        self.daemon = DaemonProcess(
            self.home,
            self.tmp / "d.sock",
            self.daemon_args(),
        )
        try:
            self.daemon.start()
        except BaseException:
            self.teardown()
            raise
        self.client = Client(self.daemon.socket_path)
        self.missed = 0  # changes verification may have found: those made through hard links

    def daemon_args(self) -> list[str]:
        """The daemon's arguments: this model verifies often (the hard-link rule needs it)."""
        return ["--watch", self.watch, "--verify-interval", str(VERIFY_INTERVAL_S)]

    def teardown(self) -> None:
        if hasattr(self, "client"):
            self.client.close()
        if self.daemon.process is not None and self.daemon.process.poll() is None:
            self.daemon.process.kill()
            self.daemon.process.wait(timeout=10)
        for process in self.sleepers + self.zombies:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- what is there now ---------------------------------------------------

    def pid_of(self, who: int) -> tuple[int, float]:
        """A live sleeper's (most often), a dead one's or a never-running pid, and its start."""
        live = [p.pid for p in self.sleepers]
        pids = live * 3 + self.dead + [NEVER_PID]
        pid = pids[who % len(pids)]
        return pid, self.starts.get(pid, time.time())

    def dirs(self) -> list[Path]:
        """Every real directory of the layout: runs, run and input dirs, receipt dirs."""
        runs = self.home / "runs"
        if not _is_real_dir(runs):
            return self.receipt_dirs()
        found = [runs]
        for run in _names(runs):
            if _is_real_dir(runs / run):
                found.append(runs / run)
                found += [
                    runs / run / n for n in _names(runs / run) if _is_real_dir(runs / run / n)
                ]
        return found + [d for d in self.receipt_dirs() if d not in found]

    def input_entries(self) -> list[Path]:
        runs = self.home / "runs"
        return [
            runs / run / name
            for run in (_names(runs) if _is_real_dir(runs) else [])
            if _is_real_dir(runs / run)
            for name in _names(runs / run)
        ]

    def receipt_dirs(self) -> list[Path]:
        return [directory for _, directory in receipt_places(self.home)]

    def receipt_entries(self) -> list[Path]:
        """Every visible entry of every receipt directory, whatever it is."""
        return [d / name for d in self.receipt_dirs() for name in _names(d)]

    def receipt_files(self) -> list[Path]:
        return [
            path
            for path in self.receipt_entries()
            if path.name.endswith(".json") and stat.S_ISREG(os.lstat(path).st_mode)
        ]

    def symlinks(self) -> list[Path]:
        found = []
        for root, dirnames, filenames in os.walk(self.home):  # never follows links
            for name in dirnames + filenames:
                if os.path.islink(os.path.join(root, name)):
                    found.append(Path(root, name))
        return sorted(found)

    # -- a start worth changing ------------------------------------------------

    @initialize(
        sleepers=st.integers(min_value=1, max_value=4), own=st.booleans(), write=st.booleans()
    )
    def set_up(self, sleepers: int, own: bool, write: bool) -> None:
        """Sleepers; maybe ses_1 owning inp_a and exe_1, ses_2 inp_b and exe_2; maybe
        live receipts in r1/inp_a, r2/inp_b and r2/x_bad, and exe_1 and exe_2."""
        for _ in range(sleepers):
            self.start_sleep()
        if own:
            with self.store() as store:
                for n, name in ((1, "a"), (2, "b")):
                    store.register_session(f"ses_{n}", context_id=f"ctx_{n}")
                    store.register_input(f"inp_{name}", f"ses_{n}")
                    store.register_exec(f"exe_{n}", f"ses_{n}")
        if write:
            for n, (run, input_name) in enumerate((("r1", "inp_a"), ("r2", "inp_b"))):
                pid, start = self.pid_of(n)
                write_provider_client_receipt(
                    self.home, run, input_name, "c1", pid, started_at_s=start
                )
                write_exec_receipt(self.home, f"exe_{n + 1}", pid, started_at_s=start)
            pid, start = self.pid_of(2)
            path = self.home / "runs" / "r2" / "x_bad" / "provider-clients" / "c1.json"
            write_atomically(path, provider_body(pid, start))

    # -- processes -------------------------------------------------------------

    @precondition(lambda self: len(self.sleepers) < MAX_SLEEPERS)
    @rule()
    def start_sleep(self) -> None:
        process = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
        self.sleepers.append(process)
        self.starts[process.pid] = start_of(process.pid)

    @precondition(lambda self: self.sleepers)
    @rule(who=PICK, reap=st.booleans())
    def kill_sleep(self, who: int, reap: bool) -> None:
        """Killed, and reaped or left a zombie (which is not live either)."""
        process = self.sleepers.pop(who % len(self.sleepers))
        process.kill()
        if reap:
            process.wait(timeout=10)
        else:
            self.zombies.append(process)
            wait_until(lambda: process.pid not in sample_processes(), message="a zombie")
        self.dead = [*self.dead[-3:], process.pid]

    # -- receipts --------------------------------------------------------------

    @rule(
        run=st.sampled_from(RUNS),
        input_name=st.sampled_from(INPUTS),
        client=st.sampled_from(CLIENTS),
        who=PICK,
        offset=st.sampled_from(OFFSETS),
        content=st.sampled_from(CONTENTS),
        how=st.sampled_from(("kit", "atomic", "in_place")),
    )
    def write_client_receipt(
        self, run: str, input_name: str, client: str, who: int, offset: int, content: str, how: str
    ) -> None:
        pid, start = self.pid_of(who)
        path = self.home / "runs" / run / input_name / "provider-clients" / f"{client}.json"
        if how == "kit" and content == "valid" and INPUT_ID.fullmatch(input_name):
            try:
                write_provider_client_receipt(
                    self.home,
                    run,
                    input_name,
                    client,
                    pid,
                    provider="p",
                    started_at_s=start + offset,
                )
            except OSError:
                pass  # a symlink or a file on the way
            return
        data = provider_body(pid, start + offset, content)
        (write_in_place if how == "in_place" else write_atomically)(path, data)

    @rule(
        name=st.sampled_from(EXEC_FILES),
        exec_id=st.sampled_from(EXEC_IDS),
        who=PICK,
        offset=st.sampled_from(OFFSETS),
        content=st.sampled_from(CONTENTS),
        how=st.sampled_from(("kit", "atomic", "in_place")),
    )
    def write_exec_receipt(
        self, name: str, exec_id: str, who: int, offset: int, content: str, how: str
    ) -> None:
        pid, start = self.pid_of(who)
        if how == "kit" and content == "valid":
            try:
                write_exec_receipt(
                    self.home, exec_id, pid, command="sleep 300", started_at_s=start + offset
                )
            except OSError:
                pass
            return
        path = self.home / "runtime" / "exec-processes" / f"{name}.json"
        data = exec_body(exec_id, pid, start + offset, content)
        (write_in_place if how == "in_place" else write_atomically)(path, data)

    @rule(pick=PICK, who=PICK, in_place=st.booleans())
    def rewrite_with_another_pid(self, pick: int, who: int, in_place: bool) -> None:
        path = _pick(self.receipt_files(), pick)
        if path is None:
            return
        pid, start = self.pid_of(who)
        exec_dir = path.parent == self.home / "runtime" / "exec-processes"
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            doc["pid"] = pid
            doc["started_at"] = round(start) if exec_dir else rfc3339(start)
            data = json.dumps(doc).encode()
        elif exec_dir:
            data = exec_body(path.stem, pid, start)
        else:
            data = provider_body(pid, start)
        (write_in_place if in_place else write_atomically)(path, data)

    @rule(pick=PICK)
    def delete_entry(self, pick: int) -> None:
        path = _pick(self.receipt_entries(), pick)
        if path is not None:
            _remove(path)

    @rule(pick=PICK, to=PICK, name=st.sampled_from(RENAME_NAMES))
    def rename_receipt(self, pick: int, to: int, name: str) -> None:
        """Within its directory, to another receipt directory, or out of the home and back."""
        loose = self.outside / "loose"
        source = _pick(self.receipt_entries() + [loose / n for n in _names(loose)], pick)
        if source is None:
            return
        targets = [source.parent, *self.receipt_dirs(), loose]
        _rename(source, _pick(targets, to) / name)

    @rule(pick=PICK, kind=st.sampled_from(("fifo", "dir")), name=st.sampled_from(SPECIAL_NAMES))
    def make_special_file(self, pick: int, kind: str, name: str) -> None:
        """A FIFO or a directory named like a receipt."""
        directory = _pick(self.receipt_dirs(), pick)
        if directory is None or _lstat(directory / name) is not None:
            return
        if kind == "fifo":
            os.mkfifo(directory / name, 0o600)
        else:
            (directory / name).mkdir(mode=0o700)

    # -- directories -----------------------------------------------------------

    @rule(
        what=st.sampled_from(
            ("input", "input", "run", "park", "unpark", "write_parked", "root_out", "root_back")
        ),
        pick=PICK,
        run=st.sampled_from(RUNS),
        name=st.sampled_from(("inp_a", "inp_b", "x_bad", "inp_c", "r1", "r2")),
    )
    def move_dir(self, what: str, pick: int, run: str, name: str) -> None:
        """An input directory renamed in the home, a run renamed, an input moved out and back."""
        runs, park = self.home / "runs", self.outside / "park"
        parked = [park / n for n in _names(park)]
        if what == "input":
            if _is_real_dir(runs) and (source := _pick(self.input_entries(), pick)):
                with contextlib.suppress(OSError):  # a file or a link named like the run
                    (runs / run).mkdir(mode=0o700, exist_ok=True)  # may be made just now
                _rename(source, runs / run / name)
        elif what == "run":
            if source := _pick(
                [runs / n for n in _names(runs)] if _is_real_dir(runs) else [], pick
            ):
                _rename(source, runs / name)
        elif what == "park":
            if source := _pick([p for p in self.input_entries() if _is_real_dir(p)], pick):
                _rename(source, park / f"p{next(self.numbers)}")
        elif what == "unpark":
            if (source := _pick(parked, pick)) and _is_real_dir(runs / run):
                _rename(source, runs / run / name)
        elif what in ("root_out", "root_back"):
            self.move_root(what == "root_out", pick)
        elif directory := _pick(parked, pick):  # written while outside the home
            pid, start = self.pid_of(pick)
            write_atomically(directory / "provider-clients" / "c1.json", provider_body(pid, start))

    def move_root(self, out: bool, pick: int) -> None:
        """``runs`` or ``runtime/exec-processes`` moved out of the home, or back."""
        root = (self.home / "runs", self.home / "runtime" / "exec-processes")[pick % 2]
        away = self.outside / f"root-{root.name}"
        if out and _lstat(away) is None:
            _rename(root, away)
        elif not out and _lstat(root) is None and _is_real_dir(root.parent):
            _rename(away, root)

    @rule(pick=PICK)
    def remove_dir(self, pick: int) -> None:
        directory = _pick(self.dirs(), pick)
        if directory is not None:
            shutil.rmtree(directory)

    # -- symlinks --------------------------------------------------------------

    def _link_target(self, target: str, pick: int, link: Path) -> Path:
        choices: dict[str, Callable[[], Path | None]] = {
            "home": lambda: self.home,
            "runs": lambda: self.home / "runs",
            "exec_dir": lambda: self.home / "runtime" / "exec-processes",
            "a_dir": lambda: _pick(self.dirs(), pick),
            "a_receipt": lambda: _pick(self.receipt_files(), pick),
            "itself": lambda: link,
            "parent": lambda: link.parent,
            "dangling": lambda: self.home / "nowhere",
            "outside": lambda: self.outside,
        }
        return choices[target]() or self.home

    @rule(
        place=PICK,
        name=st.sampled_from(LINK_NAMES),
        points_to=st.sampled_from(LINK_TARGETS),
        pick=PICK,
    )
    def make_symlink(self, place: int, name: str, points_to: str, pick: int) -> None:
        sessions = self.home / "sessions" / "ses_1"
        sessions.mkdir(mode=0o700, parents=True, exist_ok=True)
        places = [self.home, sessions, *self.dirs()]
        if _is_real_dir(self.home / "runtime"):
            places.append(self.home / "runtime")
        link = _pick(places, place) / name
        if _lstat(link) is None:
            os.symlink(self._link_target(points_to, pick, link), link)

    @rule(pick=PICK)
    def remove_symlink(self, pick: int) -> None:
        link = _pick(self.symlinks(), pick)
        if link is not None:
            link.unlink()

    # -- a hard link outside the home ------------------------------------------

    @rule(pick=PICK, who=PICK, content=st.sampled_from(("valid", "valid", "garbage")))
    def rewrite_through_hard_link(self, pick: int, who: int, content: str) -> None:
        """Rewrite a receipt through a hard link outside the home: only verification sees it."""
        expected = reference(self.home)
        kept = [
            path
            for path, state in expected.receipts.items()
            if state != "stale" and stat.S_ISREG(os.lstat(path).st_mode)
        ]
        stale = {os.lstat(p).st_ino for p, state in expected.receipts.items() if state == "stale"}
        links = self.outside / "links"
        others = [links / n for n in _names(links) if os.stat(links / n).st_ino not in stale]
        chosen = _pick(sorted(kept) + others, pick)
        if chosen is None:
            return
        if chosen in kept:
            link = links / f"h{next(self.numbers)}"
            os.link(chosen, link)
        else:
            link = chosen
        pid, start = self.pid_of(who)
        in_exec_dir = chosen.parent == self.home / "runtime" / "exec-processes"
        data = (
            exec_body("exe_1", pid, start, content)
            if in_exec_dir
            else provider_body(pid, start, content)
        )
        write_in_place(link, data)
        self.wait_for_verification()

    def wait_for_verification(self) -> None:
        """Until two runs have ended from now: the second began after this call."""
        runs = runs_of(self.client)
        wait_until(
            lambda: runs_of(self.client) >= runs + 2,
            timeout_s=10,
            message="two verification runs",
        )
        self.missed = changes_found(self.client)

    # -- the store -------------------------------------------------------------

    def store(self) -> OwnershipStore:
        return OwnershipStore(self.home / "capsule.db")

    @rule(session_id=st.sampled_from(SESSIONS), context_id=st.sampled_from(CONTEXTS))
    def register_session(self, session_id: str, context_id: str | None) -> None:
        with self.store() as store:
            store.register_session(session_id, context_id=context_id)

    @rule(key=st.sampled_from((*INPUTS, "inp_c", *EXEC_IDS)), session_id=st.sampled_from(SESSIONS))
    def own(self, key: str, session_id: str) -> None:
        """An input (or an exec) owned by a session, or moved to another."""
        with self.store() as store:
            if key.startswith("exe_"):
                store.register_exec(key, session_id)
            else:
                store.register_input(key, session_id)

    @rule(who=PICK, session_id=st.sampled_from(SESSIONS), offset=st.sampled_from(ROW_OFFSETS))
    def register_process(self, who: int, session_id: str, offset: int) -> None:
        pid, start = self.pid_of(who)
        with self.store() as store:
            store.register_process(pid, session_id, started_at_s=start + offset)

    @rule()
    def remove_store(self) -> None:
        """The store deleted while the daemon holds it open; a later write makes a new one."""
        for suffix in ("", "-wal", "-shm"):
            (self.home / f"capsule.db{suffix}").unlink(missing_ok=True)

    @rule(table=st.sampled_from(TABLES), pick=PICK)
    def delete_row(self, table: str, pick: int) -> None:
        if not (self.home / "capsule.db").exists():
            return
        db = sqlite3.connect(self.home / "capsule.db", timeout=5, isolation_level=None)
        try:
            rowids = [rowid for (rowid,) in db.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
            if rowids:
                db.execute(f"DELETE FROM {table} WHERE rowid = ?", (_pick(rowids, pick),))
        finally:
            db.close()

    # -- the check after every step --------------------------------------------

    def observe_both(self) -> tuple[ActiveSessionsSnapshot, Expected]:
        """The daemon's answer and the reference's, from the same process table."""
        for _ in range(5):
            before = sample_processes()
            snapshot = self.client.snapshot(max_age_ms=0)
            expected = reference(self.home)
            if all(before.get(pid) == expected.sample.get(pid) for pid in expected.named_pids):
                break
        return snapshot, expected

    @invariant()
    def snapshot_equals_reference(self) -> None:
        snapshot, expected = self.observe_both()
        assert snapshot.discovery == "ready", snapshot.gaps
        assert snapshot.servers == []  # no servers registry is ever written
        assert sessions_of(snapshot) == expected.sessions
        assert sorted(map(listed, snapshot.unowned)) == expected.unowned
        assert gap_paths(snapshot) == expected.broken, (snapshot.gaps, expected.broken)
        assert store_missing(snapshot) == (not expected.store_exists), snapshot.gaps
        if CHECK_MISSED:
            assert changes_found(self.client) == self.missed, self.missed_lines()

    def missed_lines(self) -> str:
        """What the daemon logged about the changes verification found."""
        log = self.daemon.log_path.read_text(errors="replace").splitlines()
        found = [line for line in log if "verification found changes" in line]
        return "verification found a missed change: " + "\n".join(found[-3:])


class PolledReaderModel(ReaderModel):
    """The same, with the daemon's own ``lstat`` poller instead of inotify."""

    watch = "polling"


# Few examples in the suite (``CAPSULED_HARDENING_FULL=1``: ten times more), and a
# timeout of their own: a loaded machine must not turn a slow run into a failure.
ReaderModel.TestCase.settings = settings(
    max_examples=size(10, 100),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PolledReaderModel.TestCase.settings = settings(
    ReaderModel.TestCase.settings, max_examples=size(6, 60)
)
_TIMEOUT = pytest.mark.timeout(size(300, 7200))
TestReaderModel = _TIMEOUT(ReaderModel.TestCase)
TestPolledReaderModel = _TIMEOUT(PolledReaderModel.TestCase)


# The many-example runs draw the same examples every time (derandomized), so a
# red CI is a change's doing, not a draw's; the suite's few examples are drawn
# anew each run.
class ManyReaderModel(ReaderModel):
    """The same model with many more examples: ``make test-slow`` (and CI) runs it."""


class ManyPolledReaderModel(PolledReaderModel):
    """The polled model with many more examples (``make test-slow``)."""


ManyReaderModel.TestCase.settings = settings(
    ReaderModel.TestCase.settings, max_examples=120, derandomize=True
)
ManyPolledReaderModel.TestCase.settings = settings(
    ReaderModel.TestCase.settings, max_examples=60, derandomize=True
)
_SLOW_TIMEOUT = pytest.mark.timeout(1200)
TestManyReaderModel = pytest.mark.slow(_SLOW_TIMEOUT(ManyReaderModel.TestCase))
TestManyPolledReaderModel = pytest.mark.slow(_SLOW_TIMEOUT(ManyPolledReaderModel.TestCase))


# ---------------------------------------------------------------------------
# Counterexamples the machine found, shrunk to plain tests


@pytest.fixture
def place() -> Iterator[Path]:
    """A short directory holding ``home`` (0700) and the socket, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="cap", dir="/tmp")).resolve()
    (tmp / "home").mkdir(mode=0o700)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def contexts(snapshot: ActiveSessionsSnapshot) -> dict[str, str | None]:
    return {session.session_id: session.context_id for session in snapshot.sessions}


def test_a_session_active_only_through_owned_processes_shows_its_new_context(
    place: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Its process list does not change; its row in ``sessions`` does."""
    home = place / "home"
    with DaemonProcess(home, place / "d.sock") as daemon, Client(daemon.socket_path) as client:
        with OwnershipStore(home / "capsule.db") as store:
            store.register_process(sleeper.pid, "ses_rows")  # no sessions row yet
        assert contexts(client.snapshot(max_age_ms=0)) == {"ses_rows": None}
        with OwnershipStore(home / "capsule.db") as store:
            store.register_session("ses_rows", context_id="ctx_rows")
        assert contexts(client.snapshot(max_age_ms=0)) == {"ses_rows": "ctx_rows"}
        with OwnershipStore(home / "capsule.db") as store:
            store.register_session("ses_rows", context_id="ctx_other")
        assert contexts(client.snapshot(max_age_ms=0)) == {"ses_rows": "ctx_other"}


def test_a_change_made_while_verification_runs_is_not_counted_as_missed(
    place: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """A directory listed before receipts came into it is listed again by verification,
    and each new entry read again; one written meanwhile was reported by the watch."""
    pytest.importorskip("inotify_simple")  # the test watches the pass itself
    home = place / "home"
    exec_dir = home / "runtime" / "exec-processes"
    exec_dir.mkdir(parents=True, mode=0o700)
    args = ["--verify-interval", "1.5"]
    with (
        DaemonProcess(home, place / "d.sock", args) as daemon,
        Client(daemon.socket_path) as client,
    ):
        client.snapshot(max_age_ms=0)  # the first walk lists the empty directory
        # Receipts nobody runs, each reported by the watch and read; the
        # directory's listing is older than all of them (unless a run listed it
        # meanwhile: then the next lists it again, for the entries after that).
        for n in range(3000):
            (exec_dir / f"e{n:04}.json").write_bytes(exec_body("exe_x", NEVER_PID, time.time()))
        last = exec_dir / "zzz.json"
        # Watched from before the last receipt: the first run to list the directory
        # after it is seen even when its listing comes before this test asks.
        with VerificationReads(home, exec_dir) as reads:
            last.write_bytes(exec_body("exe_x", NEVER_PID, time.time()))
            assert client.snapshot(max_age_ms=0).unowned == []
            reads.reading(after="listing")
        # A runtime's in-place write, which the watch reports: the pass
        # reaches this receipt only after 3000 others.
        write_in_place(last, exec_body("exe_x", sleeper.pid, start_of(sleeper.pid)))
        runs = runs_of(client)  # the runs ended so far: the pass's own, if not among them, is next
        wait_until(lambda: runs_of(client) > runs, message="the verification run to end")
        assert [p.pid for p in client.snapshot(max_age_ms=0).unowned] == [sleeper.pid]
        assert changes_found(client) == 0


def test_a_new_input_directory_is_not_counted_as_missed_by_verification(
    place: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    home = place / "home"
    (home / "runs" / "r1").mkdir(parents=True)  # listed by the first walk
    args = ["--verify-interval", "1"]
    with (
        DaemonProcess(home, place / "d.sock", args) as daemon,
        Client(daemon.socket_path) as client,
    ):
        wait_until(lambda: runs_of(client) >= 1, message="a verification run")
        runs = runs_of(client)  # the next one is about a second away
        write_provider_client_receipt(home, "r1", "inp_new", "c1", sleeper.pid)
        assert [p.pid for p in client.snapshot(max_age_ms=0).unowned] == [sleeper.pid]
        wait_until(lambda: runs_of(client) >= runs + 2, message="two verification runs")
        assert [p.pid for p in client.snapshot(max_age_ms=0).unowned] == [sleeper.pid]
        assert changes_found(client) == 0


def test_an_input_dir_renamed_into_a_run_dir_just_made_is_heard_there(
    place: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """The run directory's watch is added after the rename: no event names the input there."""
    home = place / "home"
    with DaemonProcess(home, place / "d.sock") as daemon, Client(daemon.socket_path) as client:
        for n in range(5):
            source = home / "runs" / f"from{n}" / "inp_x"
            (source / "provider-clients").mkdir(parents=True)
            client.snapshot(max_age_ms=0)  # watched where it is
            (home / "runs" / f"to{n}").mkdir()
            os.rename(source, home / "runs" / f"to{n}" / "inp_x")
            client.snapshot(max_age_ms=0)
            write_provider_client_receipt(home, f"to{n}", "inp_x", "c1", sleeper.pid)
            listed_receipts = {p.receipt for p in client.snapshot(max_age_ms=0).unowned}
            assert f"runs/to{n}/inp_x/provider-clients/c1.json" in listed_receipts


def test_a_stale_receipt_made_live_through_a_hard_link_waits_for_a_walk(
    place: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Verification re-checks the receipts it keeps, not stale ones; a walk reads everything."""
    home = place / "home"
    args = ["--verify-interval", str(VERIFY_INTERVAL_S)]
    with (
        DaemonProcess(home, place / "d.sock", args) as daemon,
        Client(daemon.socket_path) as client,
    ):
        path = write_exec_receipt(home, "exe_1", NEVER_PID, started_at_s=time.time())
        assert client.snapshot(max_age_ms=0).unowned == []
        link = place / "link.json"
        os.link(path, link)
        write_in_place(link, exec_body("exe_1", sleeper.pid, start_of(sleeper.pid)))
        client.rescan()
        assert [p.pid for p in client.snapshot(max_age_ms=0).unowned] == [sleeper.pid]


def test_a_directory_removed_while_verification_runs_is_not_counted_as_missed(
    place: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Verification re-checks candidates, then errored receipts; the run directory of one
    errored receipt is removed (and reported by the watch) while the candidates are read."""
    pytest.importorskip("inotify_simple")  # the test watches the pass itself
    home = place / "home"
    exec_dir = home / "runtime" / "exec-processes"
    exec_dir.mkdir(parents=True, mode=0o700)
    start = start_of(sleeper.pid)
    # Live: candidates, read again by every verification run. A file read less
    # than 1 s after its mtime is re-read at its next check (docs/design.md §5):
    # an mtime an hour ahead keeps them so however late the daemon reads them.
    ahead_ns = time.time_ns() + 3600 * 10**9
    for n in range(3000):
        path = exec_dir / f"e{n:04}.json"
        path.write_bytes(exec_body(f"exe_{n}", sleeper.pid, start))
        os.utime(path, ns=(ahead_ns, ahead_ns))
    broken = home / "runs" / "r1" / "inp_z" / "provider-clients" / "c1.json"
    broken.parent.mkdir(parents=True, mode=0o700)
    broken.write_bytes(provider_body(sleeper.pid, start, "schema_2"))
    args = ["--verify-interval", "1.5"]
    with (
        VerificationReads(home, exec_dir) as reads,  # the first run's cookie too
        DaemonProcess(home, place / "d.sock", args) as daemon,
        Client(daemon.socket_path) as client,
    ):
        assert str(broken) in gap_paths(client.snapshot(max_age_ms=0))
        reads.reading(after="cookie")
        shutil.rmtree(home / "runs" / "r1")  # 3000 candidates before its receipt
        runs = runs_of(client)  # the runs ended so far: the pass's own, if not among them, is next
        wait_until(lambda: runs_of(client) > runs, message="the verification run to end")
        assert str(broken) not in gap_paths(client.snapshot(max_age_ms=0))
        assert changes_found(client) == 0
