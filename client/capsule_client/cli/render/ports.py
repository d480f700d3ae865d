"""``capsulectl ports``'s table: every listening socket of every session, one row each
(docs/design.md §13 "Ports")."""

from __future__ import annotations

from typing import NamedTuple

from ...text import command_line, inert, one_line
from ...wire import ActiveSessionsSnapshot, ListeningSocket, SessionProcess
from .tree import cut

__all__ = ["Held", "held_ports", "render_ports", "unknown_pids"]

#: What the table calls the receipts no session owns.
UNOWNED = "(unowned)"


class Held(NamedTuple):
    """A socket a listed process listens on, and whose process that is."""

    session: str
    process: SessionProcess
    socket: ListeningSocket


def held_ports(snapshot: ActiveSessionsSnapshot, port: int | None = None) -> list[Held]:
    """Every listening socket the snapshot's processes hold (``port``: that port's only),
    by session (the unowned receipts' last), pid, protocol and port."""
    held: list[Held] = []
    listed = [(s.session_id, s.processes) for s in snapshot.sessions]
    listed.append((UNOWNED, snapshot.unowned))
    for session, processes in listed:
        for process in sorted(processes, key=lambda p: p.pid):
            if not isinstance(process.ports, list):
                continue
            held.extend(
                Held(session, process, socket)
                for socket in process.ports
                if port is None or socket.port == port
            )
    return held


def unknown_pids(snapshot: ActiveSessionsSnapshot) -> list[int]:
    """The listed processes whose sockets the OS did not show (``ports: null``), sorted."""
    processes = [*(p for s in snapshot.sessions for p in s.processes), *snapshot.unowned]
    return sorted({p.pid for p in processes if p.ports is None})


def endpoint(socket: ListeningSocket) -> str:
    """``address:port`` as ``ss`` writes it, an IPv6 address in brackets."""
    address = f"[{socket.address}]" if ":" in socket.address else socket.address
    return f"{inert(address)}:{socket.port}"


def _command(process: SessionProcess) -> str:
    line = command_line(process.command)
    if line is not None:
        return inert(line)
    if isinstance(process.receipt_command, str):
        return one_line(process.receipt_command)
    return "-"


def render_ports(held: list[Held], *, width: int | None = None) -> str:
    """The sockets as a table for people: protocol, address:port, pid, session and the
    command line, one row per socket (each cut to ``width`` characters; None: whole).
    The session's id, the longest cell, comes after what a narrow terminal must show."""
    rows = [("PROTO", "ADDRESS", "PID", "SESSION", "COMMAND")]
    rows.extend(
        (
            h.socket.proto,
            endpoint(h.socket),
            str(h.process.pid),
            one_line(h.session),
            _command(h.process),
        )
        for h in held
    )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i == 2 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row[:4], widths, strict=True))
        ]
        lines.append(cut("  ".join([*cells, row[4]]).rstrip(), width))
    return "\n".join(lines)
