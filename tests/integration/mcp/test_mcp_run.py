"""``capsulectl mcp`` inside ``capsulectl run``, as an agent host starts it there
(docs/design.md §10, §11): the server knows its session from ``CAPSULE_SESSION_ID``,
finds what the host left running, and marks the host's own processes as this agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.run import CAPSULECTL, Leftovers, leftovers, run_env

__all__ = ["leftovers"]  # the fixture, imported for the test below

#: An agent host: it leaves ``sleep TOKEN`` running in the background, starts
#: ``capsulectl mcp`` with the SDK's stdio client (passing its CAPSULE_* variables on,
#: as hosts pass their environment), asks ``session_processes`` and prints the result.
HOST = """
import anyio, json, os, subprocess, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    subprocess.Popen(["sleep", sys.argv[1]], stdin=subprocess.DEVNULL)
    env = {k: v for k, v in os.environ.items() if k.startswith("CAPSULE")}
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "capsule_client.cli", "mcp"], env=env
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=30) as session:
            await session.initialize()
            result = await session.call_tool("session_processes", {})
    print(json.dumps({"error": result.is_error, "result": result.structured_content}))

anyio.run(main)
"""


def test_inside_capsulectl_run_the_server_knows_its_session_and_the_host(
    sock: Path, leftovers: Leftovers
) -> None:
    token = leftovers.token()
    launcher = subprocess.Popen(
        [*CAPSULECTL, "run", "--session", "ses_mcp_host", "--terminate-on-exit=1", "--",
         sys.executable, "-c", HOST, token],
        env=run_env(sock.parent / "home", sock),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, err.decode()
    answer = json.loads(out)
    assert answer["error"] is False, answer
    result = answer["result"]
    assert result["session_id"] == "ses_mcp_host" and result["yours"] is True
    processes = result["processes"]
    (leftover,) = [p for p in processes if p["command"] == f"sleep {token}"]
    assert leftover["kind"] == "descendant" and leftover["this_agent"] is False
    assert processes[0] == leftover  # what the agent left comes first
    agent = {p["pid"]: p for p in processes if p["this_agent"]}
    assert launcher.pid in agent and agent[launcher.pid]["kind"] == "process"
    servers = [p for p in agent.values() if p["command"].endswith("capsule_client.cli mcp")]
    assert len(servers) == 1 and servers[0]["kind"] == "descendant"
    assert len(agent) == 3, agent  # the launcher, the host and the server
    # At the host's exit the launcher stopped the leftover, the one process left.
    assert "terminated session ses_mcp_host: 1 process in" in err.decode()
    assert leftovers.pids(token) == []
