"""A stdio MCP server that records its life: ``python mcp_recorder.py LOG``.

Enough of the Model Context Protocol for Claude Code to start it, list its one
tool (``ping``, which answers with the server's pid) and call it. Each line of
LOG (JSON) is one thing that happened: ``start`` (pid, argv, the environment,
the ancestry from ``/proc``), ``message`` (each request or notification
received), ``signal`` (a TERM, INT or HUP received: the server exits 0), or
``eof`` (stdin closed: it exits 0).

Standard library only; it imports its neighbour hook_recorder.py for the ancestry.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from hook_recorder import ancestry


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    log = Path(args[0])

    def note(entry: dict[str, Any]) -> None:
        with log.open("a") as file:
            file.write(json.dumps(entry) + "\n")

    def on_signal(signum: int, frame: FrameType | None) -> None:
        note({"event": "signal", "signum": signum, "ppid": os.getppid()})
        sys.exit(0)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    note(
        {
            "event": "start",
            "pid": os.getpid(),
            "argv": sys.argv,
            "env": dict(os.environ),
            "ancestry": ancestry(os.getpid()),
        }
    )

    def reply(message: dict[str, Any], result: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
        sys.stdout.write("\n")
        sys.stdout.flush()

    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        note({"event": "message", "method": method, "params": message.get("params")})
        if method == "initialize":
            reply(
                message,
                {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "recorder", "version": "1"},
                },
            )
        elif method == "tools/list":
            tool = {
                "name": "ping",
                "description": "Answer with the server's pid",
                "inputSchema": {"type": "object", "properties": {}},
            }
            reply(message, {"tools": [tool]})
        elif method == "tools/call":
            reply(message, {"content": [{"type": "text", "text": f"pong from {os.getpid()}"}]})
        elif "id" in message:
            reply(message, {})
    note({"event": "eof"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
