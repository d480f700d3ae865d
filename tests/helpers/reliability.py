"""Shared by the reliability tests: sizes, figures, descriptor limits, raw exchanges.

Each reliability test runs at a small size in CI and at its full size when
``CAPSULED_HARDENING_FULL=1``. When ``CAPSULED_RELIABILITY_OUT`` names a
directory, tests write what they measured there as one JSON file per figure;
``tests/tools/reliability.py`` runs the full suite that way and renders
docs/reliability.md from the files.
"""

from __future__ import annotations

import json
import math
import os
import resource
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models import rpc_model

from helpers.daemon import DaemonProcess, raw_exchange

FULL = os.environ.get("CAPSULED_HARDENING_FULL", "") not in ("", "0")

#: pytest-timeout for a full-size run of one test (CI keeps the global 60 s).
FULL_TIMEOUT_S = 3600


def size(ci: int, full: int) -> int:
    """The CI size, or the full size under ``CAPSULED_HARDENING_FULL=1``."""
    return full if FULL else ci


def record(name: str, figures: dict[str, Any]) -> None:
    """Keep ``figures`` for docs/reliability.md (only when asked to)."""
    out = os.environ.get("CAPSULED_RELIABILITY_OUT")
    if not out:
        return
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    figures = {"full": FULL, **figures}
    (path / f"{name}.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def nofile_of(pid: int) -> tuple[int, int]:
    """(soft, hard) "Max open files" of a running process, from /proc."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            parts = line.split()
            return _limit(parts[3]), _limit(parts[4])
    raise AssertionError(f"no open-file limit in /proc/{pid}/limits")


def _limit(text: str) -> int:
    return -1 if text == "unlimited" else int(text)


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples``, nearest rank."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def exchange(socket_path: Path, payload: bytes, *, timeout_s: float = 30.0) -> tuple[bytes, bool]:
    """Send ``payload``, half-close, read until the daemon closes.

    Sending runs in its own thread so that a payload larger than the socket
    buffers cannot deadlock against replies the daemon is writing.

    Returns:
        (everything received, whether the daemon closed before taking all of
        ``payload``: a broken pipe or reset while sending).
    """
    broken = threading.Event()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))

        def send() -> None:
            try:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                broken.set()

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        chunks = []
        deadline = time.monotonic() + timeout_s
        try:
            while chunk := sock.recv(1 << 20):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise AssertionError("the daemon kept the connection past the deadline")
        except ConnectionResetError:
            broken.set()
        sender.join(timeout_s)
    return b"".join(chunks), broken.is_set()


def served_models(socket_path: Path) -> dict[str, rpc_model.MethodModel]:
    """The reference model's methods that the daemon at ``socket_path`` serves.

    A method counts as served unless a bare call to it (no params) answers
    -32601 (method not found), so that a fuzz run covers what is built.
    """
    served = {}
    for name, model in rpc_model.METHODS.items():
        reply = raw_exchange(
            socket_path, b'{"jsonrpc":"2.0","id":0,"method":"%s"}\n' % name.encode()
        )
        if json.loads(reply).get("error", {}).get("code") != -32601:
            served[name] = model
    return served


class Prefixed(DaemonProcess):
    """The real daemon started under a wrapper command, e.g. ``prlimit --nofile=64:64``."""

    def __init__(self, *args: Any, prefix: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefix = list(prefix)

    @property
    def command(self) -> list[str]:
        return [*self.prefix, *super().command]
