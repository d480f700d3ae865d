"""A real daemon whose clock is stepped while it runs (docs/design.md §14).

The machine's clock is never touched. A step shows to a process as a moved
``btime`` in ``/proc/stat``, so the daemon runs in a mount namespace of its
own where ``/proc/stat`` is a file this test writes (bind-mounted over it), a
copy of the kernel's whose ``btime`` line the test moves by a step, either
way. Its processes are real, and their ticks are the kernel's.

After each step the daemon answers the same: the same processes under the
same (pid, started_at), the same generation (nothing looked new or gone), the
argv of each, an exit heard through the pidfd it held from before the step,
and terminate signalling each by its ticks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import DaemonProcess, short_tmpdir
from helpers.processes import DEADLINE_S, Processes
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot
from capsuled.processes.exits import pidfds_supported

STEP_S = 90
#: Bind-mounts the file named first over /proc/stat, then runs the rest.
BIND = 'mount --bind "$0" /proc/stat && exec "$@"'


def namespace_prefix() -> list[str] | None:
    """The ``unshare`` that gives a child a mount namespace of its own where it may
    bind-mount over ``/proc/stat`` (as root; else in a user namespace), or None."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return None
    private = ["--mount", "--propagation", "private"]
    candidates = [["unshare", *private]] if os.geteuid() == 0 else []
    candidates.append(["unshare", "--user", "--map-root-user", *private])
    with short_tmpdir() as tmp:
        probe = tmp / "stat"
        probe.write_text("btime 1\n")
        for prefix in candidates:
            check = "grep -qx 'btime 1' /proc/stat"
            done = subprocess.run(
                [*prefix, "sh", "-c", BIND, str(probe), "sh", "-c", check],
                capture_output=True,
                check=False,
                timeout=30,
            )
            if done.returncode == 0:
                return prefix
    return None


PREFIX = namespace_prefix()
pytestmark = [
    pytest.mark.skipif(PREFIX is None, reason="no mount namespace to give the daemon a /proc/stat"),
    pytest.mark.skipif(not pidfds_supported(), reason="no pidfd on this system"),
]


class ProcStat:
    """The ``/proc/stat`` the daemon reads: the kernel's, its ``btime`` moved as asked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kernel = Path("/proc/stat").read_bytes()
        self.btime = next(
            int(line.split()[1]) for line in self.kernel.splitlines() if line.startswith(b"btime ")
        )
        path.write_bytes(self.kernel)

    def step(self, seconds: int) -> None:
        """The clock stepped by ``seconds`` since the daemon started (rewritten in place:
        the bind mount holds this inode)."""
        lines = [
            b"btime %d" % (self.btime + seconds) if line.startswith(b"btime ") else line
            for line in self.kernel.splitlines()
        ]
        with self.path.open("r+b") as file:
            file.write(b"\n".join(lines) + b"\n")
            file.truncate()


class SteppedDaemon(DaemonProcess):
    """capsuled in a mount namespace of its own, reading ``stat`` as its ``/proc/stat``."""

    def __init__(self, *args: Any, stat: ProcStat, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stat = stat

    @property
    def command(self) -> list[str]:
        assert PREFIX is not None
        return [*PREFIX, "sh", "-c", BIND, str(self.stat.path), *super().command]


@pytest.fixture
def stepped() -> Iterator[SteppedDaemon]:
    with short_tmpdir() as tmp:
        home = tmp / "home"
        home.mkdir(mode=0o700)
        stat = ProcStat(tmp / "stat")
        with SteppedDaemon(home, tmp / "d.sock", stat=stat) as daemon:
            yield daemon
            assert daemon.process is not None and daemon.process.poll() is None


def listed(snapshot: ActiveSessionsSnapshot) -> dict[int, tuple[str, int, list[str] | None]]:
    """pid → (kind, started_at, argv) of every process of the snapshot's sessions."""
    return {
        p.pid: (p.kind, p.started_at, None if not isinstance(p.command, list) else p.command)
        for s in snapshot.sessions
        for p in s.processes
    }


def test_a_step_either_way_changes_nothing_the_daemon_answers(
    stepped: SteppedDaemon, procs: Processes
) -> None:
    home = stepped.home
    client_process, tool, doomed = procs.sleep(), procs.sleep(), procs.sleep()
    shell = procs.start(["sh", "-c", "sleep 300 & wait"])
    write_provider_client_receipt(home, "r", "inp_a", "c", client_process.pid)
    write_exec_receipt(home, "exe_a", tool.pid)
    write_exec_receipt(home, "exe_b", doomed.pid)
    with OwnershipStore(store_path(home)) as store:
        store.register_session("ses_a")
        store.register_input("inp_a", "ses_a")
        store.register_exec("exe_a", "ses_a")
        store.register_exec("exe_b", "ses_a")
        store.register_process(shell.pid, "ses_a")

    with Client(stepped.socket_path, timeout_s=30.0) as client:

        def fresh() -> ActiveSessionsSnapshot:
            snapshot = client.snapshot(fresh=True, commands=True)
            assert snapshot.discovery == "ready", snapshot.gaps
            return snapshot

        def with_descendant() -> ActiveSessionsSnapshot | None:
            snapshot = fresh()
            found = [argv for kind, _, argv in listed(snapshot).values() if kind == "descendant"]
            return snapshot if found == [["sleep", "300"]] else None  # forked, and exec'd

        before = wait_until(with_descendant, message="the shell's child listed")
        (child,) = [pid for pid, (kind, _, _) in listed(before).items() if kind == "descendant"]
        procs.adopt(child)
        held = client.status().pidfds
        assert held >= 5 and client.status().sampled == 0

        for seconds in (STEP_S, -STEP_S):
            stepped.stat.step(seconds)
            client.rescan()  # a walk: a full process table read with the stepped boot time
            for snapshot in (fresh(), fresh()):
                assert listed(snapshot) == listed(before)
                assert snapshot.generation == before.generation  # nothing new, nothing gone
            status = client.status()
            assert (status.pidfds, status.sampled) == (held, 0)  # every pidfd still held

        # The exit watch still holds the pidfd it opened before the steps: the exit is an
        # event, heard without a sample (there is none while every exit is a pidfd's).
        doomed.kill()
        doomed.wait(timeout=DEADLINE_S)
        changed = client.snapshot(since=before.generation, timeout_ms=5000)
        assert doomed.pid not in listed(changed)
        assert set(listed(changed)) == set(listed(before)) - {doomed.pid}

        report = client.terminate("ses_a", grace_s=DEADLINE_S)
        outcomes = {p.pid: p.outcome for p in report.processes}
        assert outcomes == dict.fromkeys(set(listed(before)) - {doomed.pid}, "exited")
        for process in (client_process, tool, shell):
            assert process.wait(timeout=DEADLINE_S) in (-signal.SIGTERM, 128 + signal.SIGTERM)
