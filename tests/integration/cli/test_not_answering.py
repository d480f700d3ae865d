"""A socket that takes connections but never answers is a daemon that is there and not
answering, never "capsuled is not running" (docs/design.md §9): ``capsulectl`` says so
with the time it waited and exits 1; ``capsulectl run`` says so and runs CMD."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CAPSULECTL = (sys.executable, "-m", "capsule_client.cli")


@pytest.fixture
def mute() -> Iterator[Path]:
    """A listening socket nothing reads from: connections complete in the kernel's
    backlog, requests are never answered."""
    with tempfile.TemporaryDirectory(prefix="capm", dir="/tmp") as name:
        path = Path(name) / "mute.sock"
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(path))
            listener.listen(16)
            yield path


def ctl(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run(
        [*CAPSULECTL, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    return done, time.monotonic() - start


def test_a_request_says_the_daemon_does_not_answer_and_exits_1(mute: Path) -> None:
    done, took_s = ctl("--socket", str(mute), "--timeout", "0.3", "ping")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        f"capsulectl: capsuled is running but not answering: no reply to ping from {mute} "
        "within 0.3 s."
    ), done.stderr
    assert "not running" not in done.stderr.replace("running but not answering", "")
    assert took_s < 20  # the 0.3 s, not a default


def test_run_says_the_daemon_does_not_answer_and_runs_the_command(mute: Path) -> None:
    done, _ = ctl("--socket", str(mute), "--timeout", "0.3", "run", "--", "sh", "-c", "echo ran")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"
    assert "capsuled is running but not answering: no reply to ping" in done.stderr
    assert "is not running" not in done.stderr


def test_nothing_listening_is_still_not_running(tmp_path: Path) -> None:
    """The check can fail: the other case keeps its own message and status."""
    done, _ = ctl("--socket", str(tmp_path / "none.sock"), "ping")
    assert done.returncode == 3
    assert "capsuled is not running" in done.stderr
