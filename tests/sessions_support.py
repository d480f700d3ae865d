"""Helpers shared by the reader, store and receipt tests: real processes, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

DEADLINE_S = 5.0


def wait_for(probe: Callable[[], T], *, timeout_s: float = DEADLINE_S, what: str = "") -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_s} s: {what or probe}")
        time.sleep(0.01)


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z`` for a zombie), None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None
    return data[data.rindex(b")") + 2 :].split()[0].decode()


class Sleepers:
    """Starts real ``sleep`` processes and makes sure they are gone afterwards."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(["sleep", "300"])
        self.processes.append(process)
        wait_for(lambda: proc_state(process.pid) == "S", what=f"sleep {process.pid} running")
        return process

    def kill(self, process: subprocess.Popen[bytes], *, reap: bool = True) -> None:
        process.send_signal(signal.SIGKILL)
        if reap:
            process.wait(timeout=DEADLINE_S)
        else:
            wait_for(lambda: proc_state(process.pid) == "Z", what=f"{process.pid} a zombie")

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


def make_home(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)
    return path
