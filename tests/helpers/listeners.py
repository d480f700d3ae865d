"""Real listening sockets in child processes, and a daemon that cannot see another user's.

:class:`Listener` starts ``python -c LISTENER SPEC...``: a process that opens one
socket per spec (``tcp4``, ``tcp6``, ``udp4``, ``udp6``, ``udp4-connected``,
``tcp4-client``), each on a port the kernel picks, prints what it opened as one
JSON line, and opens more for each spec line it reads on its stdin.

:class:`UnprivilegedDaemon` is the real daemon without the right to look into
another user's processes: when the tests run as root, it starts without
``CAP_SYS_PTRACE`` (reading ``/proc/<pid>/fd`` of another uid needs it) and
without ``CAP_KILL`` (signalling another uid's process needs it), as a daemon
run by an ordinary user is.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
from typing import Any

from helpers.daemon import DaemonProcess

#: Another user's uid: nobody.
NOBODY = 65534

#: Opens the sockets its arguments and stdin lines name; prints ``[[proto, address, port]]``.
LISTENER = r"""
import json, socket, sys, time
kept = []
def open_(spec):
    family = socket.AF_INET6 if "6" in spec else socket.AF_INET
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    if spec.startswith("udp"):
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.bind((host, 0))
        if spec.endswith("connected"):
            s.connect((host, 9))
        kept.append(s)
        return ["udp", host, s.getsockname()[1]]
    s = socket.socket(family, socket.SOCK_STREAM)
    if spec.endswith("client"):
        server = socket.socket(family, socket.SOCK_STREAM)
        server.bind((host, 0)); server.listen()
        s.connect(server.getsockname()[:2])
        peer, _ = server.accept()
        server.close()
        kept.extend([s, peer])
        return ["tcp", host, s.getsockname()[1]]
    s.bind((host, 0)); s.listen()
    kept.append(s)
    return ["tcp", host, s.getsockname()[1]]
print(json.dumps([open_(spec) for spec in sys.argv[1:]]), flush=True)
for line in sys.stdin:
    print(json.dumps([open_(spec) for spec in line.split()]), flush=True)
time.sleep(600)
"""

_PR_CAPBSET_DROP = 24
#: ``CAP_KILL`` and ``CAP_SYS_PTRACE``.
_DROPPED = (5, 19)
#: ``prctl(PR_CAPBSET_DROP, ...)`` of each, then exec.
_DROP_AND_EXEC = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    f"for cap in {_DROPPED}:\n"
    f"    assert libc.prctl({_PR_CAPBSET_DROP}, cap, 0, 0, 0) == 0, ctypes.get_errno()\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def ipv6_loopback() -> bool:
    """Whether a socket can be bound to ``::1`` here."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def system_python() -> str | None:
    """A Python another user may run (the test's own may live under root's home)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK) and os.stat(candidate).st_uid == 0:
            return candidate
    return shutil.which("python3")


def as_nobody() -> None:
    """``preexec_fn``: the child runs as nobody."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def unprivileged() -> None:
    """``preexec_fn``: as root, the child (and what it runs) has no ``CAP_KILL`` nor
    ``CAP_SYS_PTRACE``, as :class:`UnprivilegedDaemon`: a process may look into another
    of its uid only if it holds every capability the other does."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in _DROPPED:
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


class Listener:
    """A child process listening on the sockets ``specs`` name (see :data:`LISTENER`).

    Args:
        specs: what to open first.
        nobody: run it as nobody (with the system's Python), which needs root;
            else as this user, :func:`unprivileged`.

    Attributes:
        process: the child.
        opened: ``(proto, address, port)`` of every socket opened, in order.
    """

    def __init__(self, *specs: str, nobody: bool = False, **popen: Any) -> None:
        python = sys.executable
        extra: dict[str, Any] = {"preexec_fn": unprivileged}
        if nobody:
            found = system_python()
            assert found is not None, "no python3 another user may run"
            python = found
            extra["preexec_fn"] = as_nobody
            extra["cwd"] = "/"
        self.process = subprocess.Popen(
            [python, "-c", LISTENER, *specs],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            **extra,
            **popen,
        )
        self.opened: list[tuple[str, str, int]] = []
        self._read()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> list[tuple[str, str, int]]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the listener exited"
        opened = [(proto, address, int(port)) for proto, address, port in json.loads(line)]
        self.opened.extend(opened)
        return opened

    def open(self, *specs: str) -> list[tuple[str, str, int]]:
        """Open more sockets now; what was opened."""
        assert self.process.stdin is not None
        self.process.stdin.write(" ".join(specs) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


class Listeners:
    """Listening children (:class:`Listener`), all killed at the end: the ``listeners``
    fixture (tests/conftest.py)."""

    def __init__(self) -> None:
        self.started: list[Listener] = []

    def start(self, *specs: str, nobody: bool = False) -> Listener:
        listener = Listener(*specs, nobody=nobody)
        self.started.append(listener)
        return listener

    def close(self) -> None:
        for listener in self.started:
            listener.close()


class UnprivilegedDaemon(DaemonProcess):
    """The daemon, without ``CAP_SYS_PTRACE`` and ``CAP_KILL`` when the tests run as root."""

    @property
    def command(self) -> list[str]:
        command = super().command
        if os.geteuid() != 0:
            return command
        return [sys.executable, "-c", _DROP_AND_EXEC, *command]
