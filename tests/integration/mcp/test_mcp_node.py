"""``capsulectl mcp`` with an independent client: the TypeScript SDK, run by node
(docs/design.md §11).

``make test`` installs it (``npm ci`` in tests/node) where npm is present;
elsewhere this module is skipped and says why.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import DaemonProcess
from helpers.mcp_sessions import DEV_SERVER, exec_of, own
from helpers.processes import DEADLINE_S, Processes

NODE_DIR = Path(__file__).parents[2] / "node"
NODE = shutil.which("node")
SDK = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"

pytestmark = [
    pytest.mark.skipif(
        NODE is None, reason="node is not installed (Debian: apt-get install nodejs npm)"
    ),
    pytest.mark.skipif(
        not SDK.is_file(),
        reason="the npm package @modelcontextprotocol/sdk is not installed: "
        "`make test-tools` installs it where npm is present (npm ci in tests/node)",
    ),
]


def node_client(
    socket_path: Path, calls: list[dict[str, Any]], *flags: str, session_id: str | None = None
) -> dict[str, Any]:
    """What the TypeScript SDK's client saw: the tools, then each call's result."""
    env = {**os.environ, "CAPSULED_SOCKET": str(socket_path)}
    env.pop("CAPSULE_SESSION_ID", None)
    if session_id is not None:
        env["CAPSULE_SESSION_ID"] = session_id
    command = [sys.executable, "-m", "capsule_client.cli", "mcp", *flags]
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(NODE_DIR / "mcp_client.mjs"), json.dumps(calls), *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_the_typescript_client_lists_and_calls_the_tools(
    daemon: DaemonProcess,
    procs: Processes,
) -> None:
    dev, other = procs.start([sys.executable, *DEV_SERVER]), procs.sleep()
    exec_of(daemon.home, "ses_mine", "exe_dev", dev.pid, "npm run dev")
    own(daemon.home, "ses_other", [other.pid])
    calls = [
        {"name": "list_sessions", "arguments": {}},
        {"name": "session_processes", "arguments": {}},
        {"name": "session_processes", "arguments": {"session_id": "ses_nobody"}},
        {"name": "terminate_session", "arguments": {"session_id": "ses_other"}},
        {"name": "terminate_session", "arguments": {"grace_ms": 2000}},
    ]
    answer = node_client(daemon.socket_path, calls, "--allow-terminate", session_id="ses_mine")
    assert answer["server"]["name"] == "capsuled"
    tools = {tool["name"]: tool for tool in answer["tools"]}
    assert set(tools) == {"list_sessions", "session_processes", "terminate_session"}
    assert tools["list_sessions"]["annotations"]["readOnlyHint"] is True
    assert tools["terminate_session"]["annotations"]["destructiveHint"] is True
    assert all("outputSchema" in tool for tool in tools.values())

    listed, mine, unknown, refused, terminated = answer["results"]
    assert not listed.get("isError")
    sessions = listed["structuredContent"]["sessions"]
    assert [s["session_id"] for s in sessions] == ["ses_mine", "ses_other"]
    dev_line = shlex.join([sys.executable, *DEV_SERVER])
    assert f"pid {dev.pid}: {dev_line}" in listed["content"][0]["text"]
    (process,) = mine["structuredContent"]["processes"]
    assert (process["pid"], process["command"]) == (dev.pid, dev_line)
    assert process["receipt_command"] == "npm run dev"
    assert unknown["isError"] is True and "list_sessions" in unknown["content"][0]["text"]
    assert refused["isError"] is True
    assert refused["content"][0]["text"].startswith("Terminate refused")
    assert not terminated.get("isError"), terminated
    (stopped,) = terminated["structuredContent"]["processes"]
    assert (stopped["pid"], stopped["outcome"], stopped["command"]) == (dev.pid, "exited", dev_line)
    assert dev.wait(timeout=DEADLINE_S) == -15
    assert other.poll() is None
