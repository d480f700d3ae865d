"""The real ``capsuled`` as a subprocess on a short socket path, for benchmarks.

A small equivalent of ``tests/support.py``'s ``DaemonProcess`` (the tests'
helpers are not importable from here): it logs at ``warning`` so that request
logging costs what it costs in production, not what debug logging costs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import psutil

__all__ = ["DaemonProcess", "wait_for_socket"]

_PING = b'{"jsonrpc":"2.0","id":0,"method":"ping"}\n'


def _answers_ping(socket_path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(str(socket_path))
            sock.sendall(_PING)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return False
    return b'"pong":true' in reply


def wait_for_socket(
    socket_path: Path, process: subprocess.Popen[bytes], *, timeout_s: float, ping: bool
) -> None:
    """Wait until ``socket_path`` accepts (and answers ``ping`` if ``ping``).

    Raises:
        RuntimeError: the process exited first, or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        if ping:
            if _answers_ping(socket_path):
                return
        else:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(str(socket_path))
                return
            except OSError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{socket_path} did not answer within {timeout_s} s")
        time.sleep(0.01)


class DaemonProcess:
    """``python -m capsuled --home HOME --socket SOCKET`` until :meth:`stop`.

    Args:
        home: the home to serve (created 0700 if missing).
        socket_path: the socket (keep it short).
        args: extra command-line arguments.
        log_level: the daemon's ``--log-level``.
    """

    def __init__(
        self,
        home: Path,
        socket_path: Path,
        args: Sequence[str] = (),
        *,
        log_level: str = "warning",
    ) -> None:
        self.home = home
        self.socket_path = socket_path
        self.args = list(args)
        self.log_level = log_level
        self.log_path = socket_path.with_suffix(".log")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        if self.process is None:
            raise RuntimeError("the daemon is not started")
        return self.process.pid

    def start(self, *, timeout_s: float = 30.0) -> DaemonProcess:
        """Start it and wait until it answers ``ping``.

        Raises:
            RuntimeError: it exited or did not answer in ``timeout_s`` (the
                message carries the end of its log).
        """
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "capsuled",
            "--home",
            str(self.home),
            "--socket",
            str(self.socket_path),
            "--log-format",
            "json",
            "--log-level",
            self.log_level,
            *self.args,
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(os.environ)
            )
        try:
            wait_for_socket(self.socket_path, self.process, timeout_s=timeout_s, ping=True)
        except RuntimeError as exc:
            self.kill()
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from exc
        return self

    def rss_bytes(self) -> int:
        """The daemon's resident set size now."""
        return int(psutil.Process(self.pid).memory_info().rss)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait; SIGKILL if it does not exit in ``timeout_s``."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL and reap (no-op once exited)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
