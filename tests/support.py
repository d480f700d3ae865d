"""Test helpers: deadlines instead of sleeps, short socket paths, a real daemon.

The daemon is started by :class:`DaemonProcess`, the launcher the benchmarks use too.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

# Re-exported: the tests start the daemon with the benchmarks' launcher.
from benchmarks.daemon import DaemonProcess as DaemonProcess

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | bool | None],
    *,
    timeout_s: float = 5.0,
    interval_s: float = 0.01,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
        time.sleep(interval_s)


class ChildOutput:
    """A child process's pipe, read with deadlines (never a blocking ``readline``).

    Args:
        pipe: the child's ``stdout`` or ``stderr`` (``subprocess.PIPE``); read
            only through this object, so that no bytes wait in another buffer.
    """

    def __init__(self, pipe: Any) -> None:
        self._fd: int = pipe.fileno()
        self.seen = bytearray()  # everything read so far
        self._taken = 0  # bytes of ``seen`` already returned as lines

    def _read_more(self, deadline: float, waiting_for: str) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out waiting for {waiting_for} (read {bytes(self.seen)!r})")
        ready, _, _ = select.select([self._fd], [], [], remaining)
        if ready:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise AssertionError(f"the child closed its output before {waiting_for}")
            self.seen += chunk

    def line(self, timeout_s: float = 5.0) -> bytes:
        """The next line, without its newline; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (end := self.seen.find(b"\n", self._taken)) < 0:
            self._read_more(deadline, "a line")
        line = bytes(self.seen[self._taken : end])
        self._taken = end + 1
        return line

    def json(self, timeout_s: float = 5.0) -> Any:
        """The next line, decoded as JSON; fail after ``timeout_s``."""
        return json.loads(self.line(timeout_s))

    def wait_for(self, text: bytes, timeout_s: float = 5.0) -> None:
        """Read until ``text`` has appeared anywhere in the output; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while text not in self.seen:
            self._read_more(deadline, repr(text))


@contextmanager
def short_tmpdir() -> Iterator[Path]:
    """A fresh directory under /tmp with a short name (sockets allow 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cap", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def raw_exchange(socket_path: Path, data: bytes, *, timeout_s: float = 5.0) -> bytes:
    """Send ``data``, half-close, and return everything the daemon sent back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def answers_ping(socket_path: Path, *, timeout_s: float = 2.0) -> bool:
    """Whether a daemon serves ``socket_path``: it answers a ``ping``. No socket, a
    refused or reset connection, or no answer within ``timeout_s`` is False."""
    try:
        reply = raw_exchange(
            socket_path, b'{"jsonrpc":"2.0","id":0,"method":"ping"}\n', timeout_s=timeout_s
        )
    except OSError:
        return False
    return b'"pong":true' in reply


def raw_replies(socket_path: Path, data: bytes) -> list[Any]:
    """:func:`raw_exchange`, with each line the daemon sent back decoded as JSON."""
    return [json.loads(line) for line in raw_exchange(socket_path, data).splitlines()]


def bind_notify_socket(kind: str, directory: Path) -> tuple[socket.socket, str]:
    """A datagram socket standing in for systemd's, and its ``NOTIFY_SOCKET`` value.

    Args:
        kind: ``"path"`` (a file ``notify`` in ``directory``) or ``"abstract"``
            (a name in Linux's abstract namespace, spelt ``@name``).
        directory: where a ``"path"`` socket is bound.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if kind == "path":
        address = str(directory / "notify")
        sock.bind(address)
        return sock, address
    name = f"capsuled-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock.bind("\0" + name)
    return sock, "@" + name


def listen_unix(path: Path) -> Any:
    """A listening socket for a server run in-process (the daemon's own binding takes a lock)."""
    from capsuled.rpc.server import UnixListener

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return UnixListener(sock)


DEMO = Path(__file__).parents[1] / "examples" / "demo_runtime.py"


@contextmanager
def demo_session(home: Path) -> Iterator[tuple[str, list[int]]]:
    """Run examples/demo_runtime.py on ``home``; yield what it printed and its pids.

    The demo leaves its session's processes running (``sleep 60``, and a shell
    with two; pids in the order of its "Kill all:" line); their process groups
    are killed on the way out, whatever the test did.
    """
    result = subprocess.run(
        [sys.executable, DEMO, "--home", str(home), "--sleep-s", "60"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    kill_all = re.search(r"^Kill all: kill ([\d ]+)$", result.stdout, re.MULTILINE)
    assert kill_all, result.stdout
    pids = [int(pid) for pid in kill_all.group(1).split()]
    try:
        yield result.stdout, pids
    finally:
        for pid in pids:  # each leads its own process group: the shell's sleeps go with it
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
