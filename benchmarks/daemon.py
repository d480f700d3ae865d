"""The real ``capsuled`` as a subprocess on a short socket path: the one launcher.

The benchmarks and the tests (``tests/helpers/daemon.py`` re-exports it) both start
the daemon with :class:`DaemonProcess`. Only the standard library and psutil
are imported here, so ``python -m benchmarks`` and pytest can both import it.
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
    """``python -m capsuled --home HOME --socket SOCKET``, logging JSON to a file, until stopped.

    Leaving the ``with`` block kills it (SIGKILL, then reaps it): call
    :meth:`stop` first for a clean shutdown and its exit status.

    Args:
        home: the home to serve (the daemon creates it 0700 if missing).
        socket_path: the socket (keep it short: 107 bytes at most).
        args: extra command-line arguments (they come last, so they override
            the log level too).
        env: extra environment variables, over this process's own.
        log_level: the daemon's ``--log-level``; the benchmarks pass
            ``warning``, so that request logging costs what it costs in
            production rather than what debug logging costs.

    Attributes:
        log_path: where its output goes (appended): ``capsuled-<socket
            name>.log`` beside the home, outside what the daemon watches.
        process: the running process once :meth:`start` ran.
    """

    def __init__(
        self,
        home: Path,
        socket_path: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        *,
        log_level: str = "debug",
    ) -> None:
        self.home = home
        self.socket_path = socket_path
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.log_level = log_level
        self.log_path = home.parent / f"capsuled-{socket_path.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        """The command line it runs (a subclass may wrap it)."""
        return [
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

    @property
    def pid(self) -> int:
        """The daemon's process id.

        Raises:
            RuntimeError: it was not started.
        """
        if self.process is None:
            raise RuntimeError("the daemon is not started")
        return self.process.pid

    def start(self, *, wait: bool = True, timeout_s: float = 30.0) -> DaemonProcess:
        """Start it; with ``wait``, wait until it answers ``ping`` (:meth:`wait_ready`).

        Raises:
            RuntimeError: with ``wait``, it exited or did not answer in
                ``timeout_s``.
        """
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env
            )
        if wait:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until the socket answers ``ping``; fail early if the daemon exits.

        Raises:
            RuntimeError: it exited, or did not answer in ``timeout_s`` (then
                it is killed); the message carries the end of its log.
        """
        assert self.process is not None, "start() first"
        try:
            wait_for_socket(self.socket_path, self.process, timeout_s=timeout_s, ping=True)
        except RuntimeError as exc:
            self.kill()
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from exc

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Send ``sig`` and wait for the exit status.

        Raises:
            subprocess.TimeoutExpired: it did not exit in ``timeout_s`` (it is
                killed first, so nothing is left running).
            RuntimeError: it was not started.
        """
        if self.process is None:
            raise RuntimeError("the daemon is not started")
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL and reap (no-op once exited)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def rss_bytes(self) -> int:
        """The daemon's resident set size now."""
        return int(psutil.Process(self.pid).memory_info().rss)

    def logs(self) -> str:
        """Everything in its log so far ("" before it wrote any)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of its log."""
        return "\n".join(self.logs().splitlines()[-lines:])

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
