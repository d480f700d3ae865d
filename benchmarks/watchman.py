"""Watchman as a baseline: installed if missing, run privately, spoken to over its socket.

The server runs in the foreground as the benchmark's own child, with its
socket, log, pid file and state file in a private directory of the run and
an empty configuration file of its own (``WATCHMAN_CONFIG_FILE``), so it
touches nothing else on the machine and serves only a local Unix socket.
Requests are watchman's JSON protocol (what ``watchman -j`` sends): one JSON
array per line, one JSON object back. It is shut down at the end of the run.

Where watchman is missing and cannot be installed, or does not start, the
scenarios compare with a bare inotify watch instead (:mod:`benchmarks.inotify_tree`)
and say so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.rawclient import RawClient

__all__ = ["Watchman", "WatchmanUnavailable", "install_watchman", "query_since_line"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode


class WatchmanUnavailable(Exception):
    """Watchman is not installed and could not be, or does not run; the message says why."""


def install_watchman(*, allowed: bool, log: Any) -> str:
    """The ``watchman`` binary, installed from the distribution if missing and ``allowed``.

    Installs with ``apt-get update`` and ``apt-get install -y watchman`` (root only).

    Raises:
        WatchmanUnavailable: it is missing and was not (or could not be) installed.
    """
    found = shutil.which("watchman")
    if found is not None:
        return found
    if not allowed:
        raise WatchmanUnavailable("watchman is not installed (a --quick run does not install it)")
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise WatchmanUnavailable("watchman is not installed, and apt-get as root is not available")
    log("installing watchman: apt-get update && apt-get install -y watchman")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", "watchman"]):
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=600, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WatchmanUnavailable(f"{' '.join(command)} failed: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise WatchmanUnavailable(f"{' '.join(command)} failed: {' '.join(tail)}")
    found = shutil.which("watchman")
    if found is None:
        raise WatchmanUnavailable("apt-get installed watchman, but it is not on PATH")
    return found


def query_since_line(root: Path, clock: str, *, sync_timeout_ms: int) -> bytes:
    """A ``query`` of the ``*.json`` files changed under ``root`` since ``clock``, as a line.

    Args:
        root: the watched root.
        clock: the clock of the previous answer (or of ``clock`` / ``watch``).
        sync_timeout_ms: 0 answers from what watchman has seen so far; more
            has watchman create a cookie file in the root and wait (up to
            that long) for its event first, so the answer includes every
            change made before the query was sent. (Omitted, it defaults
            to 60 s: a cookie.)
    """
    query = {
        "since": clock,
        "expression": ["suffix", "json"],
        "fields": ["name", "exists"],
        "sync_timeout": sync_timeout_ms,
    }
    return _encode(["query", str(root), query]) + b"\n"


class Watchman:
    """A private watchman server (``watchman --foreground``) and one connection to it.

    Args:
        binary: the ``watchman`` executable.
        directory: a private directory for its socket, log, pid and state files.

    Raises:
        WatchmanUnavailable: it did not start or does not answer.
    """

    def __init__(self, binary: str, directory: Path) -> None:
        self.directory = directory
        self.socket_path = directory / "sock"
        config = directory / "watchman.json"
        config.write_text("{}\n", encoding="utf-8")
        self.log_path = directory / "log"
        command = [
            binary,
            "--foreground",
            f"--sockname={self.socket_path}",
            f"--logfile={self.log_path}",
            f"--pidfile={directory / 'pid'}",
            f"--statefile={directory / 'state'}",
            "--no-save-state",
            "--log-level",
            "0",
        ]
        env = {**os.environ, "WATCHMAN_CONFIG_FILE": str(config)}
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=directory,
        )
        self._client: RawClient | None = None
        try:
            self._client = self._connect(timeout_s=10.0)
            self.version = str(self.command("version")["version"])
        except (OSError, RuntimeError, WatchmanUnavailable) as exc:
            self.close()
            raise WatchmanUnavailable(f"watchman did not start: {exc}") from None

    def _connect(self, timeout_s: float) -> RawClient:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise WatchmanUnavailable(f"it exited with {self.process.returncode}")
            try:
                return RawClient(self.socket_path, timeout_s=120.0)
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def command(self, *args: Any) -> dict[str, Any]:
        """Send one command (``["query", root, {...}]`` as arguments); its decoded answer.

        Raises:
            RuntimeError: watchman answered an error.
        """
        assert self._client is not None
        answer: dict[str, Any] = _decode(self._client.request(_encode(list(args)) + b"\n"))
        if "error" in answer:
            raise RuntimeError(f"watchman {args[0]}: {answer['error']}")
        return answer

    def request(self, line: bytes) -> bytes:
        """Send one pre-encoded command line; its raw answer (for timing)."""
        assert self._client is not None
        return self._client.request(line)

    def watch(self, root: Path, *, timeout_ms: int = 600_000) -> str:
        """Watch ``root`` and wait for its crawl; the clock after it."""
        self.command("watch", str(root))
        return str(self.command("clock", str(root), {"sync_timeout": timeout_ms})["clock"])

    def unwatch(self, root: Path) -> None:
        """Stop watching ``root``."""
        self.command("watch-del", str(root))

    def close(self) -> None:
        """``shutdown-server``, then wait for the process (killed if it lingers)."""
        if self._client is not None:
            try:
                self.command("shutdown-server")
            except (OSError, RuntimeError):
                pass
            self._client.close()
            self._client = None
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
