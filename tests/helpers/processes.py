"""Real processes the tests start (``sleep``, children that ignore SIGTERM), gone afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from helpers.waits import wait_until

DEADLINE_S = 5.0


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z`` for a zombie), None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: read while it is being reaped
        return None
    return data[data.rindex(b")") + 2 :].split()[0].decode()


#: A child that ignores SIGTERM and says so once it does (the handler is set before the line).
IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(300)"
)


class Processes:
    """Processes the test started, directly or not: whatever still runs is killed at the end.

    Each is remembered by (pid, create time), so a pid reused since is never killed.
    """

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []
        self.others: list[psutil.Process] = []

    def start(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        self.popens.append(process)
        return process

    def sleep(self) -> subprocess.Popen[bytes]:
        process = self.start(["sleep", "300"])
        wait_until(lambda: proc_state(process.pid) == "S", message=f"sleep {process.pid} running")
        return process

    def ignoring_term(self) -> subprocess.Popen[bytes]:
        process = self.start([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE)
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        return process

    def adopt(self, pid: int) -> None:
        """A process the test did not start itself (a grandchild); one already gone is not kept."""
        try:
            self.others.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass

    def close(self) -> None:
        for other in self.others:
            try:
                other.kill()  # psutil checks the create time first
            except psutil.Error:
                pass
        for process in self.popens:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=DEADLINE_S)
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:  # also after a test that failed before closing its own
                    pipe.close()


class Sleepers:
    """Starts real ``sleep`` processes and makes sure they are gone afterwards."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(["sleep", "300"])
        self.processes.append(process)
        wait_until(lambda: proc_state(process.pid) == "S", message=f"sleep {process.pid} running")
        return process

    def kill(self, process: subprocess.Popen[bytes], *, reap: bool = True) -> None:
        process.send_signal(signal.SIGKILL)
        if reap:
            process.wait(timeout=DEADLINE_S)
        else:
            wait_until(lambda: proc_state(process.pid) == "Z", message=f"{process.pid} a zombie")

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=DEADLINE_S)


@contextmanager
def sleepers() -> Iterator[Sleepers]:
    pool = Sleepers()
    try:
        yield pool
    finally:
        pool.close()


def child_of(pid: int) -> int:
    """The one running child of ``pid`` (waited for)."""

    def find() -> int | None:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    data = Path(f"/proc/{name}/stat").read_bytes()
                except OSError:
                    continue
                fields = data[data.rindex(b")") + 2 :].split()
                if int(fields[1]) == pid and fields[0] == b"S":
                    return int(name)
        return None

    return wait_until(find, message=f"a child of {pid}")
