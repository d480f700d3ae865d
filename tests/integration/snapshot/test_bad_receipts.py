"""The receipt catalogue, data-driven, through the real daemon (docs/design.md §2, §3, §5).

Each entry puts one hostile thing where receipts live — in a provider-clients
directory and in ``runtime/exec-processes`` — beside a good live session.
The snapshot must stay ``ready``, list the good session, never list the bad
receipt's process, answer within its deadline (a FIFO must not block the
walk), and name the bad path in its gaps exactly when the entry says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import DaemonProcess, short_tmpdir
from helpers.waits import wait_until

from benchmarks.daemon import wait_for_socket
from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore

OTHER_UID = 65534  # nobody

Maker = Callable[[Path, int, float], None]


def _iso(start_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(start_s))


def _good_fields(kind: str, pid: int, start_s: float) -> dict[str, Any]:
    if kind == "provider":
        return {"schema_version": 1, "pid": pid, "started_at": _iso(start_s)}
    return {"schema_version": 1, "exec_id": "exe_bad", "pid": pid, "started_at": int(start_s)}


def content(make: Callable[[dict[str, Any]], bytes]) -> Callable[[str], Maker]:
    """An entry whose file holds ``make(good fields of a live process)``."""

    def for_kind(kind: str) -> Maker:
        def write(path: Path, pid: int, start_s: float) -> None:
            path.write_bytes(make(_good_fields(kind, pid, start_s)))

        return write

    return for_kind


def fields(**changes: Any) -> Callable[[str], Maker]:
    def make(good: dict[str, Any]) -> bytes:
        merged = {**good, **changes}
        return json.dumps({k: v for k, v in merged.items() if v is not DROP}).encode()

    return content(make)


DROP = object()


def special(write: Callable[[Path, int, float], None]) -> Callable[[str], Maker]:
    return lambda kind: write


def _fifo(path: Path, pid: int, start_s: float) -> None:
    os.mkfifo(path, 0o600)


def _directory(path: Path, pid: int, start_s: float) -> None:
    path.mkdir(mode=0o700)
    (path / "inner.json").write_text("{}")


def _symlink_to(target: str) -> Callable[[Path, int, float], None]:
    def write(path: Path, pid: int, start_s: float) -> None:
        os.symlink(target, path)

    return write


def _symlink_to_good(path: Path, pid: int, start_s: float) -> None:
    elsewhere = path.parent.parent / f".{path.name}.elsewhere"
    elsewhere.write_text(json.dumps(_good_fields("exec", pid, start_s)))
    os.symlink(elsewhere, path)


def _other_uid(path: Path, pid: int, start_s: float) -> None:
    path.write_text(json.dumps(_good_fields("exec", pid, start_s)))
    os.chown(path, OTHER_UID, OTHER_UID)


def _sparse(path: Path, pid: int, start_s: float) -> None:
    with path.open("wb") as out:
        out.truncate(1 << 30)


def _mode_000(path: Path, pid: int, start_s: float) -> None:
    path.write_text("{}")
    path.chmod(0)


@dataclass(frozen=True)
class ReceiptCase:
    name: str
    make: Callable[[str], Maker]
    gap: bool = True  # the bad path is named in the gaps


RECEIPTS = [
    ReceiptCase("utf8-bom", content(lambda g: b"\xef\xbb\xbf" + json.dumps(g).encode())),
    ReceiptCase("pid-as-string", fields(pid="4242")),
    ReceiptCase("pid-negative", fields(pid=-5)),
    ReceiptCase("pid-zero", fields(pid=0)),
    ReceiptCase("pid-one", fields(pid=1)),
    ReceiptCase("pid-float", fields(pid=4242.0)),
    ReceiptCase(
        "pid-huge",
        content(
            lambda g: (
                json.dumps(g).encode().replace(b'"pid": ', b'"pid": 1' + b"0" * 40 + b', "x": ')
            )
        ),
        gap=False,  # a pid no process can have is > 1, so valid, and never live
    ),
    ReceiptCase("pid-int64-max", fields(pid=2**63 - 1), gap=False),
    ReceiptCase("pid-above-pid-max", fields(pid=2**31 + 7), gap=False),
    ReceiptCase(
        "pid-1e400",
        content(lambda g: json.dumps(g).encode().replace(b'"pid": ', b'"pid": 1e400, "x": ')),
    ),
    ReceiptCase("pid-nested-junk", fields(pid={"a": [1, {"b": None}]})),
    ReceiptCase(
        "deep-nesting-in-an-unknown-member",
        content(
            lambda g: json.dumps(g).encode()[:-1] + b', "x": ' + b"[" * 30000 + b"]" * 30000 + b"}"
        ),
    ),
    ReceiptCase("schema-version-2", fields(schema_version=2)),
    ReceiptCase("missing-pid", fields(pid=DROP)),
    ReceiptCase("started-at-garbage", fields(started_at="yesterday")),
    ReceiptCase("invalid-utf8", content(lambda g: json.dumps(g).encode()[:-1] + b', "x": "\xff"}')),
    ReceiptCase("nul-bytes", content(lambda g: b"\0" * 512)),
    ReceiptCase("not-an-object", content(lambda g: b"[1, 2, 3]")),
    ReceiptCase("empty-file", content(lambda g: b"")),
    ReceiptCase(
        "larger-than-64-KiB", content(lambda g: json.dumps({**g, "pad": "p" * 70_000}).encode())
    ),
    ReceiptCase("sparse-1-GiB", special(_sparse)),
    ReceiptCase("directory-named-x.json", special(_directory)),
    ReceiptCase("fifo-named-x.json", special(_fifo)),
    ReceiptCase("symlink-to-a-good-receipt", special(_symlink_to_good)),
    ReceiptCase("symlink-to-dev-zero", special(_symlink_to("/dev/zero"))),
    ReceiptCase("symlink-dangling", special(_symlink_to("/nonexistent/x.json"))),
    ReceiptCase("owned-by-another-uid", special(_other_uid)),
    # As root (these tests' usual user) mode 000 does not stop a read: the file
    # is read, and "{}" is an invalid receipt. test_an_unreadable_receipt covers
    # the unreadable case by running the daemon as another user.
    ReceiptCase("mode-000", special(_mode_000)),
]


# --------------------------------------------------------------------------
# Setup: one good live session, then one bad thing per test


@dataclass
class World:
    daemon: DaemonProcess
    home: Path
    sleeper: subprocess.Popen[bytes]
    start_s: float


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with short_tmpdir() as tmp:
        home = tmp / "home"
        home.mkdir(mode=0o700)
        sleeper = subprocess.Popen(["sleep", "600"])
        try:
            write_provider_client_receipt(home, "run_1", "inp_good", "cli_1", sleeper.pid)
            write_exec_receipt(home, "exe_good", sleeper.pid)
            with OwnershipStore(store_path(home)) as store:
                store.register_session("ses_good", context_id="ctx")
                store.register_input("inp_good", "ses_good")
                store.register_exec("exe_good", "ses_good")
            from capsule_client.kit.receipts import process_start_time

            start_s = process_start_time(sleeper.pid)
            with DaemonProcess(home, tmp / "r.sock", ["--log-level", "info"]) as daemon:
                yield World(daemon, home, sleeper, start_s)
        finally:
            sleeper.kill()
            sleeper.wait()


def snapshot(world: World) -> dict[str, Any]:
    """A fresh observation after a full walk, so the bad path has certainly been seen."""
    with Client(world.daemon.socket_path, timeout_s=10) as client:
        client.rescan()
        raw = client.call_raw("sessions.snapshot", {"max_age_ms": 0, "timeout_ms": 3000})
    result: dict[str, Any] = json.loads(raw)
    return result


def place(world: World, where: str) -> Path:
    if where == "provider":
        directory = world.home / "runs" / "run_1" / "inp_bad" / "provider-clients"
    else:
        directory = world.home / "runtime" / "exec-processes"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / "x.json"


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["provider", "exec"])
@pytest.mark.parametrize("case", RECEIPTS, ids=[c.name for c in RECEIPTS])
def test_receipt_catalogue(world: World, case: ReceiptCase, where: str) -> None:
    path = place(world, where)
    if where == "provider":
        with OwnershipStore(store_path(world.home)) as store:
            store.register_input("inp_bad", "ses_bad")
    case.make(where)(path, world.sleeper.pid, world.start_s)
    try:
        began = time.monotonic()
        snap = wait_until(
            lambda: (s := snapshot(world))["discovery"] == "ready" and s,
            timeout_s=10,
            message="a ready snapshot",
        )
        elapsed_s = time.monotonic() - began
        ids = {s["session_id"] for s in snap["sessions"]}
        assert "ses_good" in ids, snap
        assert "ses_bad" not in ids, snap
        named = [g for g in snap["gaps"] if str(path) in g or "x.json" in g]
        assert bool(named) == case.gap, (case.name, snap["gaps"])
        assert elapsed_s < 5
    finally:
        remove(path)
    with Client(world.daemon.socket_path) as client:
        assert client.ping().pong is True
    assert world.daemon.process is not None and world.daemon.process.poll() is None


def test_an_unreadable_receipt_is_a_gap_for_a_daemon_that_cannot_read_it(
    short_dir: Path,
) -> None:
    """chmod 000 stops a reader that is not root: run the daemon as another user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the daemon as another user")
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    receipt = home / "runtime" / "exec-processes" / "x.json"
    receipt.parent.mkdir(mode=0o700, parents=True)
    receipt.write_text("{}")
    receipt.chmod(0)
    for path in [short_dir, home, home / "runtime", receipt.parent, receipt]:
        os.chown(path, OTHER_UID, OTHER_UID)
    daemon = DaemonProcess(home, short_dir / "u.sock")
    command = daemon.command
    log = daemon.log_path.open("ab")
    daemon.process = subprocess.Popen(
        ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *command],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env={**daemon.env, "HOME": str(home)},
    )
    log.close()
    try:
        snap = ready_snapshot_as(OTHER_UID, daemon)
        assert any(str(receipt) in g and "ermission" in g for g in snap["gaps"]), snap["gaps"]
    finally:
        daemon.__exit__()


def ready_snapshot_as(uid: int, daemon: DaemonProcess) -> dict[str, Any]:
    """The first ready snapshot a client running as ``uid`` gets from ``daemon``, started
    as that user (it refuses peers of another uid, -32006).

    Its start is given what the launcher gives any daemon's start, which load
    stretches, and no client competes with it for the CPU meanwhile; then a
    ready answer is asked for.

    Raises:
        AssertionError: the daemon exited, did not listen, or gave no ready
            answer; the message has the last answer and the end of its log.
    """
    assert daemon.process is not None
    answers: list[dict[str, Any] | str] = []

    def ready() -> dict[str, Any] | None:
        answers.append(snapshot_as(uid, daemon.socket_path))
        answer = answers[-1]
        return answer if isinstance(answer, dict) and answer["discovery"] == "ready" else None

    try:
        wait_for_socket(daemon.socket_path, daemon.process, timeout_s=30.0, ping=False)
        snap: dict[str, Any] = wait_until(ready, timeout_s=15, message="a ready snapshot")
    except (AssertionError, RuntimeError) as exc:
        last = answers[-1] if answers else "none asked"
        raise AssertionError(f"{exc}; the last answer: {last!r}\n{daemon.log_tail()}") from exc
    return snap


ASK = """
import json, sys
from capsule_client import Client
with Client(sys.argv[1], timeout_s=5) as client:
    print(client.call_raw("sessions.snapshot", {"max_age_ms": 0}).decode())
"""


def snapshot_as(uid: int, socket_path: Path) -> dict[str, Any] | str:
    """A snapshot asked by a client running as ``uid``, or the last line the client wrote
    to stderr when it got none."""
    done = subprocess.run(
        [
            *("setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"),
            *(sys.executable, "-c", ASK, str(socket_path)),
        ],
        capture_output=True,
        timeout=30,
    )
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return said[-1] if said else f"exit status {done.returncode}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result
