"""Helpers for `capsulectl run` tests: the launcher as its own process, leftovers found by
their exact command line, and every leftover killed at the end (docs/design.md §10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from capsule_client import Client
from capsule_client.wire import SessionProcess
from helpers.processes import proc_state
from helpers.waits import wait_until

#: The launcher, as a separate process (it must be the process that stays).
CAPSULECTL = [sys.executable, "-m", "capsule_client.cli"]


def run_env(home: Path, sock: Path) -> dict[str, str]:
    """The environment a launcher test runs ``capsulectl run`` in."""
    env = dict(os.environ)
    env.update(CAPSULE_HOME=str(home), CAPSULED_SOCKET=str(sock))
    env.pop("CAPSULE_SESSION_ID", None)
    return env


def with_argv(pid: int) -> list[str] | None:
    """``/proc/<pid>/cmdline`` as a list, ``None`` for a process gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [os.fsdecode(part) for part in raw.split(b"\0")[:-1]] or None


class Leftovers:
    """Sleeps with a unique duration each test asks for, found by their exact argv,
    and killed (by pid) at the end wherever they were re-parented."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def token(self) -> str:
        """A ``sleep`` duration no other process has: ``900.<random digits>``."""
        token = f"900.{uuid.uuid4().int % 10**12:012d}"
        self.tokens.append(token)
        return token

    def pids(self, token: str) -> list[int]:
        """The running ``sleep TOKEN`` processes (exec done: argv is exactly that)."""
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit() and with_argv(int(name)) == ["sleep", token]:
                if proc_state(int(name)) not in (None, "Z"):
                    found.append(int(name))
        return sorted(found)

    def running(self, token: str, count: int = 1, *, timeout_s: float) -> list[int]:
        """The ``count`` ``sleep TOKEN`` processes, once each runs sleep: a child started
        by ``(sleep T &)`` is a fork of its shell until its exec, with the shell's argv."""
        return wait_until(
            lambda: len(found := self.pids(token)) == count and found,
            timeout_s=timeout_s,
            message=f"{count} sleep {token}",
        )

    def close(self) -> None:
        for token in self.tokens:
            for pid in self.pids(token):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def leftovers() -> Iterator[Leftovers]:
    pool = Leftovers()
    try:
        yield pool
    finally:
        pool.close()


def session_processes(sock: Path, session_id: str) -> dict[int, SessionProcess]:
    """pid → process of ``session_id`` in a fresh snapshot (read-your-writes)."""
    with Client(sock) as client:
        snapshot = client.snapshot(fresh=True)
    for session in snapshot.sessions:
        if session.session_id == session_id:
            return {process.pid: process for process in session.processes}
    return {}


def launch(
    home: Path, sock: Path, session_id: str, argv: list[str], *options: str
) -> subprocess.Popen[bytes]:
    """``capsulectl run --session SESSION OPTIONS -- ARGV``, stderr piped."""
    return subprocess.Popen(
        [*CAPSULECTL, "run", "--session", session_id, *options, "--", *argv],
        env=run_env(home, sock),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
