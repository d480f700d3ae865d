"""A command line reads the same wherever capsulectl shows it (docs/design.md §5, §10):
a byte that is not UTF-8 is ``\\xff`` in ``sessions``, in ``run``'s report from the
daemon's argv, and in the report from ``/proc`` when the daemon gave none."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.daemon import DaemonProcess
from capsule_client.cli.run import process_command_line, render_leftovers
from capsule_client.client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import SessionProcess

CAPSULECTL = (sys.executable, "-m", "capsule_client.cli")
#: What every rendering shows of the argument ``b"x\xff"``: one backslash.
SHOWN = "'x\\xff'"


@pytest.fixture
def odd() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose last argument is not UTF-8."""
    with subprocess.Popen([b"sh", b"-c", b"sleep 300", b"x\xff"]) as process:
        try:
            deadline = time.monotonic() + 10
            while b"x\xff" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
                assert time.monotonic() < deadline, "the exec did not happen"
                time.sleep(0.01)
            yield process
        finally:
            process.kill()


def test_sessions_and_run_show_the_same_escape(odd: subprocess.Popen[bytes]) -> None:
    with tempfile.TemporaryDirectory(prefix="capo", dir="/tmp") as name:
        home = Path(name) / "home"
        home.mkdir(mode=0o700)
        with OwnershipStore(store_path(home)) as store:
            store.register_session("ses_odd")
            store.register_process(odd.pid, "ses_odd")
        with DaemonProcess(home, Path(name) / "d.sock") as daemon:
            shown = subprocess.run(
                [*CAPSULECTL, "--socket", str(daemon.socket_path), "sessions", "--wide"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert shown.returncode == 0, shown.stderr
            with Client(daemon.socket_path, timeout_s=30) as client:
                snapshot = client.snapshot(fresh=True, commands=True)
    [row] = [line for line in shown.stdout.splitlines() if str(odd.pid) in line]
    assert row.endswith(f"sh -c 'sleep 300' {SHOWN}"), row
    [session] = snapshot.sessions
    [listed] = [process for process in session.processes if process.pid == odd.pid]
    from_daemon = render_leftovers("ses_odd", [listed], now_s=time.time()).splitlines()[1]
    assert from_daemon.endswith(f"sh -c 'sleep 300' {SHOWN}"), from_daemon
    from_proc = process_command_line(SessionProcess("process", odd.pid, 0, command=None))
    assert from_proc == f"sh -c 'sleep 300' {SHOWN}"
