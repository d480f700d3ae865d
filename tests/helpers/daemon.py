"""A real daemon and its socket: the launcher, short socket paths, raw exchanges.

The daemon is started by :class:`DaemonProcess`, the launcher the benchmarks use too.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Re-exported: the tests start the daemon with the benchmarks' launcher.
from benchmarks.daemon import DaemonProcess as DaemonProcess


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
