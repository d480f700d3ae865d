"""A start the daemon refuses leaves the socket's directory (and the home's parents) as
they were (docs/design.md §8 "One daemon per socket"): no lock file, no directory it
made, and a running daemon's own lock untouched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.daemon import DaemonProcess
from capsuled.rpc import sockets
from capsuled.startup_errors import ServiceError

CAPSULED = (sys.executable, "-m", "capsuled")


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short directory under /tmp (socket paths hold 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="capr", dir="/tmp") as name:
        yield Path(name)


def listing(path: Path) -> dict[str, str]:
    """Every entry under ``path`` and its kind (and a file's content)."""
    found = {}
    for entry in sorted(path.rglob("*")):
        kind = "socket" if entry.is_socket() else "dir" if entry.is_dir() else entry.read_text()
        found[str(entry.relative_to(path))] = kind
    return found


def capsuled(home: Path, sock: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CAPSULED, "--home", str(home), "--socket", str(sock), "--log-format", "json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_daemon_leaves_the_first_ones_files_as_they_were(tmp: Path) -> None:
    home = tmp / "home"
    home.mkdir(mode=0o700)
    sock = tmp / "s" / "c.sock"
    with DaemonProcess(home, sock) as first:
        before = listing(tmp)
        assert before["s/c.sock.lock"] == f"{first.pid}\n"
        refused = capsuled(tmp / "new" / "home", sock)
        assert refused.returncode == 1, refused.stderr
        assert f"capsuled is already running for {sock} (pid {first.pid}" in refused.stderr
        assert listing(tmp) == before  # the home it would have made is not left either
        # The first one's lock still holds: a third start is refused the same way.
        assert capsuled(home, sock).returncode == 1
        assert first.stop() == 0


def test_a_socket_path_taken_by_a_file_leaves_no_lock_and_no_home(tmp: Path) -> None:
    (tmp / "s").mkdir()
    (tmp / "s" / "c.sock").write_text("not a socket\n")
    before = listing(tmp)
    refused = capsuled(tmp / "a" / "b" / "home", tmp / "s" / "c.sock")
    assert refused.returncode == 1, refused.stderr
    assert "is a regular file, not a socket" in refused.stderr
    assert listing(tmp) == before


def test_a_live_socket_something_else_serves_leaves_no_lock(tmp: Path) -> None:
    home = tmp / "home"
    home.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(tmp / "c.sock"))
        other.listen()
        before = listing(tmp)
        refused = capsuled(home, tmp / "c.sock")
        assert refused.returncode == 1, refused.stderr
        assert "holds no capsuled lock" in refused.stderr
        assert listing(tmp) == before


def test_an_unsafe_home_leaves_the_socket_directory_unmade(tmp: Path) -> None:
    home = tmp / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    refused = capsuled(home, tmp / "x" / "y" / "c.sock")
    assert refused.returncode == 1, refused.stderr
    assert f"chmod 0700 {home}" in refused.stderr
    assert listing(tmp) == {"home": "dir"}


def test_a_refused_bind_removes_the_lock_and_the_directories_it_made(tmp: Path) -> None:
    """The bind's own refusal (a path past the 107 bytes, which the command line refuses
    before anything is made) after the directories and the lock were made."""
    sock = tmp / "a" / "b" / ("x" * 120)
    with pytest.raises(ServiceError, match="longer than"):
        sockets.open_listener(sock, environ={})
    assert listing(tmp) == {}
    # The check can fail: a start that serves leaves its directories and lock file.
    served = tmp / "a" / "b" / "c.sock"
    listening = sockets.open_listener(served, environ={})
    try:
        assert set(listing(tmp)) == {"a", "a/b", "a/b/c.sock", "a/b/c.sock.lock"}
    finally:
        listening.sock.close()
        listening.close()
    assert listing(tmp) == {"a": "dir", "a/b": "dir", "a/b/c.sock.lock": ""}
