"""``capsulectl ports [PORT]``: which sessions' processes listen on which ports
(docs/design.md §13 "Ports")."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from ..client import Client
from ..wire import ActiveSessionsSnapshot
from .exits import EXIT_OK, EXIT_REMOTE_ERROR
from .render.output import print_json, say_unsettled
from .render.ports import held_ports, render_ports, unknown_pids
from .render.tree import terminal_width

__all__ = ["arguments", "run"]

#: Asked as ``capsulectl sessions`` asks (read-your-writes), with the sockets.
PARAMS = {"max_age_ms": 0, "commands": True, "ports": True}


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, not {text!r}")
    return port


def arguments(parser: argparse.ArgumentParser) -> None:
    """``[PORT] [--wide]``."""
    parser.add_argument(
        "port",
        metavar="PORT",
        type=_port,
        nargs="?",
        help="only this port: name the session and process that listen on it "
        "(exit status 1 when none does)",
    )
    parser.add_argument(
        "--wide", action="store_true", help="whole command lines (not cut to the terminal's width)"
    )


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask a fresh snapshot with the sockets; print them (``--json``: the snapshot as it
    came). With ``PORT``, the exit status says whether a process listens on it."""
    port: int | None = args.port
    if args.json:
        raw = client.call_raw("sessions.snapshot", PARAMS)
        print_json(out, raw)
        if port is None:
            return EXIT_OK
        import msgspec

        answer = msgspec.json.decode(raw, type=ActiveSessionsSnapshot)
        return EXIT_OK if held_ports(answer, port) else EXIT_REMOTE_ERROR
    snapshot = client.snapshot(fresh=True, commands=True, ports=True)
    if say_unsettled(snapshot.discovery, snapshot.gaps):  # never shown as "none listens"
        return EXIT_REMOTE_ERROR
    held = held_ports(snapshot, port)
    unknown = _unknown(unknown_pids(snapshot))
    if port is not None and not held:
        print(
            f"capsulectl: no process of a session listens on port {port}{unknown}", file=sys.stderr
        )
        return EXIT_REMOTE_ERROR
    if held:
        print(render_ports(held, width=None if args.wide else terminal_width(out)), file=out)
    else:
        print("no process of a session listens on a port", file=out)
    if unknown:
        print(unknown.strip(" ()"), file=out)
    return EXIT_OK


def _unknown(pids: list[int]) -> str:
    """`` (the sockets of N processes ...)``, or "" when the OS showed every one."""
    if not pids:
        return ""
    shown = ", ".join(map(str, pids[:10])) + (", …" if len(pids) > 10 else "")
    count = f"{len(pids)} process{'es' if len(pids) != 1 else ''}"
    return f" (the OS does not show this user the sockets of {count}: pid {shown})"
