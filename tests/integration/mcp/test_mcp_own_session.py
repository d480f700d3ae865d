"""``capsulectl mcp`` under an agent host its hooks registered (docs/design.md §11, §12):
no ``CAPSULE_SESSION_ID``, so the server's session is the one that lists the server or
its nearest ancestor; ``terminate_session`` on it stops what the host left running and
spares the host and the server (``--spare-none``: the old, whole terminate).

The host is a real process that registers itself as its session's root through the
writer kit (as ``capsulectl hook`` registers Claude Code), leaves a ``sleep`` running,
starts the server with the SDK's stdio client, and prints what the tools answered.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.run import Leftovers, leftovers, run_env

__all__ = ["leftovers"]  # the fixture

#: The host: ``sys.argv`` = session id, sleep token, then the server's flags.
HOST = """
import anyio, json, os, subprocess, sys, time
from pathlib import Path
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore

session_id, token, *flags = sys.argv[1:]
with OwnershipStore(store_path(Path(os.environ["CAPSULE_HOME"]))) as store:
    store.ensure_session(session_id)
    store.register_process(os.getpid(), session_id)
leftover = subprocess.Popen(["sleep", token], stdin=subprocess.DEVNULL)

async def main():
    env = {"CAPSULED_SOCKET": os.environ["CAPSULED_SOCKET"]}  # no CAPSULE_SESSION_ID
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "capsule_client.cli", "mcp", *flags], env=env
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=30) as session:
            await session.initialize()
            deadline = time.monotonic() + 20
            while True:  # until the daemon's look has found the leftover and the server
                listed = await session.call_tool("session_processes", {})
                pids = {p["pid"] for p in (listed.structured_content or {}).get("processes", [])}
                if (leftover.pid in pids and len(pids) >= 3) or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.2)
            stopped = await session.call_tool("terminate_session", {"grace_ms": 2000})
    answer = {
        "host": os.getpid(),
        "leftover": leftover.pid,
        "listed": [listed.is_error, listed.structured_content, listed.content[0].text],
        "stopped": [stopped.is_error, stopped.structured_content, stopped.content[0].text],
    }
    print(json.dumps(answer), flush=True)

anyio.run(main)
"""


def host(sock: Path, session_id: str, token: str, *flags: str) -> subprocess.Popen[str]:
    env = run_env(sock.parent / "home", sock)
    return subprocess.Popen(
        [sys.executable, "-c", HOST, session_id, token, *flags],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen[str]) -> tuple[int, dict[str, Any] | None, str]:
    try:
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, json.loads(out) if out.strip() else None, err


def test_the_server_s_session_is_its_host_s_and_terminate_spares_them(
    sock: Path, leftovers: Leftovers
) -> None:
    token = leftovers.token()

    code, answer, err = finished(host(sock, "ses_hooked", token, "--allow-terminate"))

    assert code == 0, err
    assert answer is not None
    listed_error, listed, listed_text = answer["listed"]
    assert listed_error is False, listed_text
    assert listed["session_id"] == "ses_hooked" and listed["yours"] is True
    processes = {p["pid"]: p for p in listed["processes"]}
    assert processes[answer["host"]]["kind"] == "process"
    assert processes[answer["host"]]["this_agent"] is True
    assert processes[answer["leftover"]]["this_agent"] is False
    server_command = "capsule_client.cli mcp --allow-terminate"
    [server] = [p for p in processes.values() if p["command"].endswith(server_command)]
    assert server["this_agent"] is True and server["kind"] == "descendant"
    assert listed_text.startswith("Your session ses_hooked has 3 live processes")
    assert "but this agent's own, which are spared" in listed_text

    stopped_error, stopped, stopped_text = answer["stopped"]
    assert stopped_error is False, stopped_text
    outcomes = {p["pid"]: p["outcome"] for p in stopped["processes"]}
    assert outcomes == {
        answer["host"]: "spared",
        server["pid"]: "spared",
        answer["leftover"]: "exited",
    }
    assert "2 spared (this agent: left running)" in stopped_text
    assert f"pid {answer['leftover']}: sleep {token} — exited after SIGTERM" in stopped_text
    assert leftovers.pids(token) == []


def test_spare_none_stops_the_host_and_the_server_too(sock: Path, leftovers: Leftovers) -> None:
    token = leftovers.token()

    code, answer, _err = finished(
        host(sock, "ses_whole", token, "--allow-terminate", "--spare-none")
    )

    assert code == -15  # the host got SIGTERM from its own server's tool call
    assert answer is None
    assert leftovers.pids(token) == []


def test_a_server_no_session_lists_says_how_to_register_its_host(sock: Path) -> None:
    """The check above can fail: outside any session, the server knows none."""
    script = """
import anyio, os, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    env = {"CAPSULED_SOCKET": os.environ["CAPSULED_SOCKET"]}
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "capsule_client.cli", "mcp"], env=env
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=30) as session:
            await session.initialize()
            result = await session.call_tool("session_processes", {})
    print(result.is_error, result.content[0].text)

anyio.run(main)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=run_env(sock.parent / "home", sock),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True session_processes needs a session")
    assert "capsulectl integrate claude-code" in done.stdout
    assert "capsulectl run -- <host>" in done.stdout


@pytest.mark.parametrize("flags", [["--spare-none"], ["--spare-none", "--any-session"]])
def test_spare_none_without_allow_terminate_is_a_usage_error(flags: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "capsule_client.cli", "mcp", *flags],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2
    assert "--spare-none applies to --allow-terminate" in done.stderr
