"""Faults: the daemon killed mid-reconcile, a full or read-only records root.

The rules are docs/design.md §6, §8.

Sizes: CI kills the daemon during 8 reconciles; ``CAPSULED_HARDENING_FULL=1``
during 100. The full and read-only records roots are a small tmpfs mounted
for the test (as root); without the privilege to mount, those tests skip and
the RLIMIT_FSIZE test still covers a failing append.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import DaemonProcess
from helpers.reliability import FULL, FULL_TIMEOUT_S, Prefixed, record, size
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import LostReport

pytestmark = pytest.mark.timeout(FULL_TIMEOUT_S if FULL else 60)


# --------------------------------------------------------------------------
# Traces, written as plain JSON lines (what any runtime writes)


def event(kind: str, session: str, **fields: Any) -> dict[str, Any]:
    return {
        "event_type": kind,
        "event_id": f"evt_{kind}_{fields.pop('n', 0)}",
        "session_id": session,
        "timestamp": 1_700_000_000_000,
        **fields,
    }


def prior_trace(
    root: Path, session: str, *, works: int = 3, done: int = 1, filler: int = 0, command: str = ""
) -> tuple[Path, set[str]]:
    """A prior session: ``works`` detached works left running, ``done`` completed ones.

    Returns:
        (the trace, the work ids that are unaccounted).
    """
    directory = root / session
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = [
        event("session_start", session),
        event("task_start", session, task_id="tsk_a", trust="trusted"),
    ]
    lost, all_works = set(), []
    for i in range(works + done):
        work_id = f"wrk_{session}_{i}"
        all_works.append(work_id)
        lines.append(
            event(
                "shell_detached",
                session,
                n=i,
                task_id="tsk_a",
                work_id=work_id,
                binary="/bin/sh",
                command=command or f"sleep {i}",
            )
        )
        if i < works:
            lost.add(work_id)
    for work_id in all_works[works:]:
        lines.append(event("shell_completed", session, work_id=work_id, binary="/bin/sh"))
    filler_line = json.dumps(event("model_output", session, text="f" * 400))
    body = "".join(json.dumps(line) + "\n" for line in lines) + (filler_line + "\n") * filler
    trace = directory / "trace.jsonl"
    trace.write_text(body)
    return trace, lost


def records(trace: Path) -> list[dict[str, Any]]:
    """Every line of the trace as a JSON object; fails on any line that does not parse."""
    out = []
    for number, line in enumerate(trace.read_bytes().split(b"\n")[:-1], 1):
        value = json.loads(line)
        assert isinstance(value, dict), (trace, number, line[:200])
        out.append(value)
    assert trace.read_bytes().endswith(b"\n")
    return out


def markers(trace: Path) -> list[dict[str, Any]]:
    return [r for r in records(trace) if r["event_type"] == "shell_lost"]


def reconcile_params(from_session: str, this_session: str) -> dict[str, str]:
    return {"from_session": from_session, "this_session": this_session, "context_id": "ctx"}


def request(params: dict[str, Any], id: int = 1) -> bytes:
    return (
        json.dumps(
            {"jsonrpc": "2.0", "id": id, "method": "session.reconcile", "params": params}
        ).encode()
        + b"\n"
    )


def ask(daemon: DaemonProcess, params: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(daemon.socket_path))
        s.sendall(request(params))
        buffer = b""
        while not buffer.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, "the daemon closed without a reply"
            buffer += chunk
    reply: dict[str, Any] = json.loads(buffer)
    return reply


def lost_ids(report: dict[str, Any] | LostReport | None) -> set[str]:
    if report is None:
        return set()
    if isinstance(report, LostReport):
        return {w.work_id for w in report.lost}
    return {w["work_id"] for w in report["lost"]}


# --------------------------------------------------------------------------
# kill -9 at random points


def _reconcile_then_kill(daemon: DaemonProcess, params: dict[str, Any], delay_s: float) -> bytes:
    """Send a reconcile, SIGKILL the daemon ``delay_s`` later, return what arrived."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(daemon.socket_path))
        s.sendall(request(params))
        # The delay places the kill; it orders nothing, so it is a plain sleep.
        time.sleep(delay_s)
        assert daemon.process is not None
        daemon.process.kill()
        daemon.process.wait(timeout=10)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                received += chunk
    return received


def test_kill_9_during_reconciles_reports_each_lost_work_exactly_once(short_dir: Path) -> None:
    count = size(8, 100)
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    root = home / "sessions"
    # Filler makes a scan take a few milliseconds, so kills land inside it too.
    expected = {i: prior_trace(root, f"ses_k{i}", works=3, filler=2000) for i in range(count)}
    prior_trace(root, "ses_warm", works=3, filler=2000)
    args = ["--log-level", "warning"]
    daemon = DaemonProcess(home, short_dir / "k.sock", args).start()
    rng = random.Random(20261129)
    outcomes = {"reply_before_kill": 0, "killed_after_markers": 0, "killed_before_markers": 0}
    try:
        began = time.perf_counter()
        ask(daemon, reconcile_params("ses_warm", "ses_warm_r"))
        typical_s = time.perf_counter() - began
        for i in range(count):
            session, resumer = f"ses_k{i}", f"ses_r{i}"
            trace, lost = expected[i]
            params = reconcile_params(session, resumer)
            received = _reconcile_then_kill(daemon, params, rng.uniform(0, 2 * typical_s))
            early = [json.loads(line) for line in received.splitlines()]
            marked = {m["work_id"] for m in markers(trace)}  # every line still parses
            assert marked in (set(), lost), (i, marked, lost)
            daemon = DaemonProcess(home, short_dir / "k.sock", args).start()
            retried = ask(daemon, params)
            again = ask(daemon, params)
            other = ask(daemon, reconcile_params(session, f"ses_other{i}"))
            # The retry rule (docs/design.md §6): the same report for the same session,
            # nothing for another.
            report = retried["result"]
            assert report is not None and lost_ids(report) == lost, (i, retried)
            assert again["result"] == report
            assert other["result"] is None, other
            if early:
                assert early[0]["result"] == report, (early, report)
                outcomes["reply_before_kill"] += 1
            elif marked:
                outcomes["killed_after_markers"] += 1
            else:
                outcomes["killed_before_markers"] += 1
            found = markers(trace)
            assert sorted(m["work_id"] for m in found) == sorted(lost), "a duplicate or a gap"
            assert {m["reconciled_task_id"] for m in found} == {report["task_id"]}
            assert {m["reconciled_by_session"] for m in found} == {resumer}
    finally:
        daemon.__exit__()
    record(
        "kill9",
        {
            "title": "kill -9 during reconciles",
            "text": (
                "Each reconcile of a prior session (3 lost works, 2,000 filler lines) is "
                "followed by SIGKILL at a random point within twice a typical reconcile's "
                "time, then a restart and the same request again, twice, and once from "
                "another session. Every lost work got exactly one marker, every retry the "
                "same report (task id and works), the other session nothing, and every "
                "trace line parses."
            ),
            "reconciles_killed": count,
            "typical_reconcile_ms": round(typical_s * 1000, 2),
            **outcomes,
        },
    )


# --------------------------------------------------------------------------
# A records root that cannot take the markers


@contextlib.contextmanager
def small_tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted on ``path`` (skips the test if we may not mount)."""
    path.mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system holding ``directory``; return the filler file."""
    filler = directory / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return filler


def assert_refused_then_recovered(
    daemon: DaemonProcess, trace: Path, lost: set[str], recover: Any, cause: str
) -> dict[str, Any]:
    before = trace.read_bytes()
    params = reconcile_params(trace.parent.name, "ses_next")
    refused = ask(daemon, params)
    assert refused["error"]["code"] == -32603, refused
    assert cause in refused["error"]["message"], refused
    assert trace.read_bytes() == before, "a failed append left bytes behind"
    assert markers(trace) == []
    recover()
    report = ask(daemon, params)["result"]
    assert lost_ids(report) == lost
    assert sorted(m["work_id"] for m in markers(trace)) == sorted(lost)
    assert ask(daemon, params)["result"] == report
    return refused


def test_a_full_records_root_reports_nothing_and_marks_nothing(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with small_tmpfs(home / "sessions", 256 * 1024) as root:
        # Commands of 6 KiB make the markers need fresh pages even with slack in the last one.
        trace, lost = prior_trace(root, "ses_full", works=3, command="c" * 6000)
        filler = fill(root)
        with DaemonProcess(home, short_dir / "f.sock") as daemon:
            refused = assert_refused_then_recovered(
                daemon, trace, lost, filler.unlink, "No space left on device"
            )
            assert "reconcile failed" in daemon.logs()
    record(
        "full_root",
        {
            "title": "A full records root",
            "text": "A 256 KiB tmpfs filled to the last page; the markers need more.",
            "answer": f"{refused['error']['code']}: {refused['error']['message']}".replace(
                str(home), "<home>"
            ),
        },
    )


def test_a_read_only_records_root_reports_nothing_and_marks_nothing(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with small_tmpfs(home / "sessions", 1024 * 1024) as root:
        trace, lost = prior_trace(root, "ses_ro", works=2)
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)

        def writable() -> None:
            subprocess.run(["mount", "-o", "remount,rw", str(root)], check=True)

        with DaemonProcess(home, short_dir / "r.sock") as daemon:
            assert_refused_then_recovered(daemon, trace, lost, writable, "Read-only file system")


def test_a_file_size_limit_mid_append_reports_nothing_and_leaves_no_torn_marker(
    short_dir: Path,
) -> None:
    """RLIMIT_FSIZE on the daemon: the markers' write stops part way (EFBIG).

    Python ignores SIGXFSZ, so the daemon sees a short write and then EFBIG;
    whatever part reached the file must be taken back.
    """
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    trace, lost = prior_trace(home / "sessions", "ses_fsize", works=3, command="c" * 3000)
    limit = trace.stat().st_size + 5000  # room for one marker and a half
    daemon = Prefixed(
        home,
        short_dir / "z.sock",
        ["--log-level", "warning"],
        prefix=["prlimit", f"--fsize={limit}"],
    ).start()
    try:
        before = trace.read_bytes()
        refused = ask(daemon, reconcile_params("ses_fsize", "ses_next"))
        assert refused["error"]["code"] == -32603, refused
        assert "File too large" in refused["error"]["message"], refused
        assert trace.read_bytes() == before
        assert markers(trace) == []
    finally:
        daemon.__exit__()
    with DaemonProcess(home, short_dir / "z.sock") as daemon:
        report = ask(daemon, reconcile_params("ses_fsize", "ses_next"))["result"]
        assert lost_ids(report) == lost
    assert sorted(m["work_id"] for m in markers(trace)) == sorted(lost)


# --------------------------------------------------------------------------
# The reader's faults: a locked store, a home deleted and re-created


def live_session(home: Path, sleeper: subprocess.Popen[bytes], session: str) -> None:
    """A provider-client receipt for ``sleeper`` and a store saying ``session`` owns it."""
    write_provider_client_receipt(home, "run_1", "inp_1", "cli_1", sleeper.pid)
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session, context_id="ctx")
        store.register_input("inp_1", session)


def fresh_snapshot(daemon: DaemonProcess) -> dict[str, Any]:
    with Client(daemon.socket_path, timeout_s=15) as client:
        raw = client.call_raw("sessions.snapshot", {"max_age_ms": 0, "timeout_ms": 3000})
    result: dict[str, Any] = json.loads(raw)
    return result


def sessions_of(snap: dict[str, Any]) -> set[str]:
    return {s["session_id"] for s in snap["sessions"]}


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def test_a_store_locked_past_the_busy_timeout_is_unavailable_then_recovers(
    short_dir: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    live_session(home, sleeper, "ses_live")
    # A writer that keeps the store to itself: in WAL mode only an exclusive
    # locking mode keeps readers out, and it can only be had while no reader
    # holds the store open, so the writer takes it before the daemon starts
    # (the daemon keeps its read-only connection open once it has one).
    writer = sqlite3.connect(store_path(home), isolation_level=None)
    writer.execute("PRAGMA locking_mode = EXCLUSIVE")
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("INSERT INTO sessions VALUES ('ses_w', NULL, NULL, 0)")
    released = False
    try:
        args = ["--log-level", "info", "--sample-interval", "60"]
        with DaemonProcess(home, short_dir / "s.sock", args) as daemon:
            fresh_snapshot(daemon)  # may join the first observation, already waiting
            began = time.monotonic()  # this one observes from the start: nothing else runs
            locked = fresh_snapshot(daemon)
            waited_s = time.monotonic() - began
            assert locked["discovery"] == "unavailable", locked
            assert locked["sessions"] == []
            assert any("locked" in gap for gap in locked["gaps"]), locked["gaps"]
            with Client(daemon.socket_path) as client:
                assert client.ping().pong is True  # the server is not held up
            writer.execute("ROLLBACK")
            writer.close()
            released = True
            recovered = wait_until(
                lambda: (s := fresh_snapshot(daemon))["discovery"] == "ready" and s,
                message="discovery to recover",
            )
            assert sessions_of(recovered) == {"ses_live"}
    finally:
        if not released:
            writer.close()
    assert waited_s >= 1.0  # the busy timeout (docs/design.md §4: at least 1 s) was honoured
    record(
        "store_locked",
        {
            "title": "The store locked past the busy timeout",
            "text": (
                "A writer holds the store with an exclusive lock in WAL mode. The snapshot "
                "is unavailable and its gap says the store is locked; once the writer "
                "lets go, the next snapshot is ready with the live session again."
            ),
            "unavailable_answer_after_s": round(waited_s, 2),
            "gap": next(g for g in locked["gaps"] if "locked" in g).replace(str(home), "<home>"),
        },
    )


@pytest.mark.parametrize("watch", ["polling", "native"])
def test_the_home_deleted_and_recreated_is_recovered(
    short_dir: Path, sleeper: subprocess.Popen[bytes], watch: str
) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    live_session(home, sleeper, "ses_before")
    args = ["--log-level", "info", "--watch", watch]
    with DaemonProcess(home, short_dir / "h.sock", args) as daemon:
        assert sessions_of(fresh_snapshot(daemon)) == {"ses_before"}
        with Client(daemon.socket_path) as client:
            assert client.status().watcher == watch
        shutil.rmtree(home)
        gone = fresh_snapshot(daemon)
        # No session survives its receipts, and the answer says what is missing.
        assert gone["sessions"] == [] and gone["unowned"] == [], gone
        assert f"home {home} does not exist" in gone["gaps"][0], gone
        home.mkdir(mode=0o700)
        live_session(home, sleeper, "ses_after")
        # The first observation after the home reappears walks it, whatever the
        # watcher has noticed yet (a polling watch notices about a second later).
        back = fresh_snapshot(daemon)
        assert back["discovery"] == "ready" and sessions_of(back) == {"ses_after"}, back
        with Client(daemon.socket_path) as client:
            status = client.status()
        assert status.totals.readers_restarted >= 1
        assert status.watcher == watch
        # Changes after the recovery still arrive (the watch follows the new home).
        with OwnershipStore(home / "capsule.db") as store:
            store.register_session("ses_later", context_id="ctx")
            store.register_input("inp_1", "ses_later")
        wait_until(
            lambda: sessions_of(fresh_snapshot(daemon)) == {"ses_later"},
            timeout_s=10,
            message="a change after recovery",
        )
    assert back["gaps"] == [], back["gaps"]


@pytest.mark.parametrize("watch", ["polling", "native"])
def test_a_home_symlink_pointed_elsewhere_is_followed_though_its_old_target_remains(
    short_dir: Path, sleeper: subprocess.Popen[bytes], watch: str
) -> None:
    before, after = short_dir / "before", short_dir / "after"
    for target in (before, after):
        target.mkdir(mode=0o700)
    live_session(before, sleeper, "ses_before")
    home = short_dir / "home"
    home.symlink_to(before)
    with DaemonProcess(home, short_dir / "l.sock", ["--watch", watch]) as daemon:
        assert sessions_of(fresh_snapshot(daemon)) == {"ses_before"}
        live_session(after, sleeper, "ses_after")
        relinked = short_dir / "relinked"
        relinked.symlink_to(after)
        relinked.rename(home)  # as `ln -sfn`: the old target stays where it was
        wait_until(
            lambda: sessions_of(fresh_snapshot(daemon)) == {"ses_after"},
            timeout_s=10,
            message="the sessions of the new target",
        )
