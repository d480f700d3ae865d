"""Command lines through the real daemon: ``commands: true`` (docs/design.md §5, §7).

The session's root is a real Python process with spaces, quotes and bytes
that are not UTF-8 in its argv; it starts a ``sleep`` (a descendant) and,
when told, ``exec``\\ s into another ``sleep``. Its exec receipt claims a
command of its own, which stays ``receipt_command``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shlex
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import DEADLINE_S, Processes
from helpers.waits import wait_until

from capsule_client import AsyncClient, Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot, SessionProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: Starts ``sleep 302``, says its pid, and ``exec``s into ``sleep 301`` on a line of input.
ROOT = (
    "import os, subprocess, sys; child = subprocess.Popen(['sleep', '302']); "
    "print(child.pid, flush=True); sys.stdin.readline(); os.execvp('sleep', ['sleep', '301'])"
)
ODD = [b"two words", b'say "hi"', b"caf\xc3\xa9 \xff"]
SHOWN = [sys.executable, "-c", ROOT, "two words", 'say "hi"', "café \\xff"]


class Root:
    """The session's root process and its child, listed under ``ses_cmd``."""

    def __init__(self, daemon: DaemonProcess, procs: Processes) -> None:
        self.process = procs.start(
            [sys.executable, "-c", ROOT, *ODD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.process.stdout is not None
        self.child = int(self.process.stdout.readline())
        procs.adopt(self.child)
        with OwnershipStore(store_path(daemon.home)) as store:
            store.register_session("ses_cmd")
            store.register_exec("exe_root", "ses_cmd")
        write_exec_receipt(daemon.home, "exe_root", self.process.pid, command="python demo")

    def exec_sleep(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.close()


@pytest.fixture
def procs() -> Iterator[Processes]:
    started = Processes()
    try:
        yield started
    finally:
        for process in started.popens:
            if process.stdin is not None and not process.stdin.closed:
                process.stdin.close()
        started.close()


@pytest.fixture
def root(daemon: DaemonProcess, procs: Processes) -> Root:
    return Root(daemon, procs)


def processes_of(processes: list[Any], pid: int) -> Any:
    (found,) = [p for p in processes if p["pid"] == pid]
    return found


def listed(snapshot: ActiveSessionsSnapshot) -> dict[int, SessionProcess]:
    return {p.pid: p for s in snapshot.sessions if s.session_id == "ses_cmd" for p in s.processes}


def test_snapshot_with_commands_and_without(daemon: DaemonProcess, root: Root) -> None:
    pid = root.process.pid
    with Client(daemon.socket_path) as client:
        wait_until(
            lambda: {pid, root.child} <= listed(client.snapshot()).keys(),
            timeout_s=DEADLINE_S,
            message="the root and its child listed",
        )
        raw = client.call_raw("sessions.snapshot", {"commands": True, "max_age_ms": 0})
        (session,) = json.loads(raw.decode("utf-8", "strict"))["sessions"]
        shown = processes_of(session["processes"], pid)
        assert shown["command"] == SHOWN
        assert shown["receipt_command"] == "python demo"  # the receipt's claim, kept apart
        child = processes_of(session["processes"], root.child)
        assert child["command"] == ["sleep", "302"]
        assert child["parent_pid"] == pid

        plain = client.call_raw("sessions.snapshot", {"max_age_ms": 0})
        assert b'"command"' not in plain and b'"receipt_command":"python demo"' in plain

        typed = listed(client.snapshot(commands=True))
        assert typed[pid].command == SHOWN and typed[root.child].command == ["sleep", "302"]

        root.exec_sleep()
        found = wait_until(
            lambda: listed(client.snapshot(commands=True, fresh=True)).get(pid),
            timeout_s=DEADLINE_S,
            message="the root listed",
        )
        # Read-your-writes checks every process for an exec, but the exec itself
        # is asynchronous: wait for it.
        wait_until(
            lambda: (
                listed(client.snapshot(commands=True, fresh=True))[pid].command == ["sleep", "301"]
            ),
            timeout_s=DEADLINE_S,
            message="the exec'd command",
        )
        assert found.kind == "exec"
        # Without fresh, the check is at most a second old.
        wait_until(
            lambda: listed(client.snapshot(commands=True))[pid].command == ["sleep", "301"],
            timeout_s=DEADLINE_S,
            message="the exec'd command without fresh",
        )


def test_a_subscription_with_commands_sees_an_exec(daemon: DaemonProcess, root: Root) -> None:
    pid = root.process.pid
    with Client(daemon.socket_path) as client:
        wait_until(
            lambda: {pid, root.child} <= listed(client.snapshot(max_age_ms=0)).keys(),
            timeout_s=DEADLINE_S,
            message="the root and its child listed",
        )
        with Client(daemon.socket_path) as watcher, watcher.subscribe(commands=True) as changes:
            first = changes.next(timeout_s=DEADLINE_S)
            assert first.full
            (session,) = first.added
            commands = {p.pid: p.command for p in session.processes}
            assert commands == {pid: SHOWN, root.child: ["sleep", "302"]}

            root.exec_sleep()
            change = changes.next(timeout_s=DEADLINE_S)
            assert [s.session_id for s in change.changed] == ["ses_cmd"]
            commands = {p.pid: p.command for p in change.changed[0].processes}
            assert commands[pid] == ["sleep", "301"]
            assert change.generation == first.generation  # the answer itself did not change

        with Client(daemon.socket_path) as watcher, watcher.subscribe() as changes:
            plain = changes.next(timeout_s=DEADLINE_S)
            assert {p.pid for p in plain.added[0].processes} == {pid, root.child}
            assert all(p.command is msgspec.UNSET for p in plain.added[0].processes)


def test_terminate_reports_each_command(daemon: DaemonProcess, root: Root) -> None:
    pid = root.process.pid
    with Client(daemon.socket_path, timeout_s=30.0) as client:
        wait_until(
            lambda: {pid, root.child} <= listed(client.snapshot(max_age_ms=0)).keys(),
            timeout_s=DEADLINE_S,
            message="the root and its child listed",
        )
        report = client.terminate("ses_cmd", grace_s=5.0, commands=True)
    by_pid = {p.pid: p for p in report.processes}
    assert by_pid[pid].command == SHOWN and by_pid[pid].kind == "exec"
    assert by_pid[root.child].command == ["sleep", "302"]
    assert (by_pid[root.child].parent_pid, by_pid[root.child].root_pid) == (pid, pid)
    assert {p.outcome for p in report.processes} == {"exited"}


def test_the_async_client_asks_for_commands(daemon: DaemonProcess, root: Root) -> None:
    pid = root.process.pid

    async def main() -> dict[int, SessionProcess]:
        async with AsyncClient(daemon.socket_path) as client:
            with anyio.fail_after(DEADLINE_S):
                while True:
                    found = listed(await client.snapshot(commands=True, fresh=True))
                    if {pid, root.child} <= found.keys():
                        return found
                    await anyio.sleep(0.05)

    found = anyio.run(main)
    assert found[pid].command == SHOWN and found[root.child].command == ["sleep", "302"]


def _on_a_terminal(argv: list[str], columns: int) -> str:
    """``argv``'s output on a pseudo-terminal ``columns`` wide (no ``$COLUMNS``)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    with subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env) as child:
        os.close(follower)
        out = bytearray()
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert child.wait(timeout=DEADLINE_S) == 0, out
    os.close(leader)
    return out.decode().replace("\r\n", "\n")


def test_capsulectl_cuts_rows_to_the_terminal_and_not_through_a_pipe(
    daemon: DaemonProcess, root: Root
) -> None:
    pid = root.process.pid
    with Client(daemon.socket_path) as client:
        wait_until(
            lambda: {pid, root.child} <= listed(client.snapshot()).keys(),
            timeout_s=DEADLINE_S,
            message="the root and its child listed",
        )
    capsulectl = [sys.executable, "-m", "capsule_client.cli", "--socket", str(daemon.socket_path)]
    shown = _on_a_terminal([*capsulectl, "sessions"], 60).splitlines()
    (row,) = [line for line in shown if f" {pid} " in line]
    assert len(row) == 60 and row.endswith("…"), shown
    (child,) = [line for line in shown if f" {root.child} " in line]
    assert child.endswith(" \\_ sleep 302"), shown
    assert all(len(line) <= 60 for line in shown if line.startswith(("ses_", " ")))

    piped = subprocess.run(
        [*capsulectl, "sessions"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    (row,) = [line for line in piped if f" {pid} " in line]
    assert row.endswith(shlex.join(SHOWN)), piped  # whole, as ps prints through a pipe
