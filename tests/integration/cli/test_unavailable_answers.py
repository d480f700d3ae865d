"""An unavailable answer is never shown as an empty one (docs/design.md §9): ``sessions``,
``top`` and ``watch`` say why first and exit 1, the MCP tools answer a tool error that
says why, and ``--json`` prints the answer as it came.

The daemon refuses a home that group or others can write (docs/design.md §3): made
0777 while a session runs, every answer is ``unavailable`` with the fix as its gap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from benchmarks.daemon import DaemonProcess
from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore
from capsule_client.mcp.server import McpOptions, build_server

CAPSULECTL = [sys.executable, "-m", "capsule_client.cli"]


@pytest.fixture
def unsafe() -> Iterator[DaemonProcess]:
    """A daemon whose home holds a session with a live process, then is made 0777."""
    with tempfile.TemporaryDirectory(prefix="capu", dir="/tmp") as name:
        home = Path(name) / "home"
        home.mkdir(mode=0o700)
        sleeper = subprocess.Popen(["sleep", "300"])
        try:
            with OwnershipStore(store_path(home)) as store:
                store.register_session("ses_busy")
                store.register_process(sleeper.pid, "ses_busy")
            with DaemonProcess(home, Path(name) / "d.sock") as daemon:
                done = ctl(daemon, "sessions")
                assert done.returncode == 0 and "ses_busy" in done.stdout, done.stderr
                os.chmod(home, 0o777)
                yield daemon
        finally:
            sleeper.kill()
            sleeper.wait()


def ctl(
    daemon: DaemonProcess, *args: str, timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CAPSULECTL, "--socket", str(daemon.socket_path), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def said_first(daemon: DaemonProcess, done: subprocess.CompletedProcess[str]) -> None:
    """Exit 1, nothing on stdout, and the gap with its fix first on stderr."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"capsulectl: discovery unavailable: the home {daemon.home} is "), first
    assert f"Fix: `chmod 0700 {daemon.home}`" in first
    assert "no active sessions" not in done.stderr


def test_sessions_says_why_and_exits_1(unsafe: DaemonProcess) -> None:
    said_first(unsafe, ctl(unsafe, "sessions"))


def test_sessions_json_is_the_answer_as_it_came(unsafe: DaemonProcess) -> None:
    done = ctl(unsafe, "sessions", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["discovery"] == "unavailable" and answer["sessions"] == []
    assert any("chmod 0700" in gap for gap in answer["gaps"])


def test_top_once_says_why_and_exits_1(unsafe: DaemonProcess) -> None:
    said_first(unsafe, ctl(unsafe, "top", "--once", "--interval", "0.1"))


def test_watch_says_why_at_once_and_exits_1(unsafe: DaemonProcess) -> None:
    said_first(unsafe, ctl(unsafe, "watch", timeout_s=30))


def test_the_mcp_tools_answer_a_tool_error_that_says_why(unsafe: DaemonProcess) -> None:
    server = build_server(McpOptions(unsafe.socket_path, timeout_s=30, session_id="ses_busy"))

    async def ask() -> list[str]:
        texts = []
        for tool in ("list_sessions", "session_processes"):
            result = await server.call_tool(tool, {})
            assert result.is_error, result
            texts.append(result.content[0].text)
        return texts

    for text in anyio.run(ask):
        assert text.startswith(f"discovery unavailable: the home {unsafe.home} is "), text
        assert f"chmod 0700 {unsafe.home}" in text
        assert "has no live process" not in text and "0 active sessions" not in text


def test_once_repaired_the_sessions_are_there_again(unsafe: DaemonProcess) -> None:
    """The check can fail: the same commands show the session once the home is safe."""
    os.chmod(unsafe.home, 0o700)
    done = ctl(unsafe, "sessions")
    assert done.returncode == 0 and "ses_busy" in done.stdout, done.stderr
