"""What ``capsulectl`` prints: the tables for people (status, sessions, top, watch).

Every string that comes from a receipt or a trace goes through :func:`inert`
or :func:`one_line` first, so it prints as one line that cannot act on the
terminal. The layouts are for people and may change (docs/design.md §9);
``--json`` is the stable output.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Final

import msgspec

from ...text import counted, duration, inert, one_line, unsettled
from ...wire import (
    ActiveSessionsSnapshot,
    Session,
    SessionProcess,
    SessionsChanged,
    StatusResult,
)
from .tree import Row, cut, shown, tree

__all__ = [
    "JSON_ENCODER",
    "ChangePrinter",
    "render_sessions",
    "render_status",
    "render_top",
    "session_state",
]

#: The encoder for ``--json`` output the client built itself (``top``, ``watch``).
JSON_ENCODER: Final = msgspec.json.Encoder()


def render_status(status: StatusResult) -> str:
    """``status`` as aligned ``key: value`` lines for people."""
    if status.discovery is None:
        discovery = "no observation yet"
    else:
        age = "" if status.last_observed_at is None else _age(status.last_observed_at)
        discovery = f"{status.discovery}" + (f" (observed {age} ago)" if age else "")
    totals = status.totals
    rows = [
        ("daemon", f"capsuled {status.version}, pid {status.pid}, up {duration(status.uptime_s)}"),
        ("home", status.home),
        ("socket", status.socket),
        ("watcher", _watch_line(status)),
        ("verification", _verification_line(status)),
        ("discovery", discovery),
        (
            "clients",
            f"{status.clients}, {status.subscriptions} subscriptions, "
            f"{status.long_polls} long polls waiting",
        ),
        (
            "exits",
            f"pidfd events ({status.pidfds} held)"
            if status.exit_watch == "pidfd"
            else f"pidfd events ({status.pidfds} held), {status.sampled} noticed by sampling"
            if status.pidfds
            else "noticed by sampling",
        ),
        (
            "totals",
            f"{totals.requests} requests, {totals.errors} errors, "
            f"{totals.observations} observations, {totals.rescans} rescans, "
            f"{totals.readers_restarted} reader restarts",
        ),
    ]
    if status.last_cost is not None:
        cost = status.last_cost
        rows.append(
            (
                "last cost",
                f"{cost.directories} dirs, {cost.receipts} receipts, {cost.bytes} bytes, "
                f"{cost.process_samples} samples, {cost.rescans} rescans, "
                f"{cost.retained} retained, {cost.dirty_paths} dirty",
            )
        )
    rows.extend(("note", note) for note in status.notes)
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key + ':':<{width + 1}} {value}" for key, value in rows)


def _watch_line(status: StatusResult) -> str:
    watch = status.watch
    if watch is None:  # an older daemon
        return status.watcher
    if watch.mode == "off":
        return "off (every observation walks the home)"
    line = f"{watch.mode} ({watch.backend}), {_directories(watch.watched_directories)} watched"
    if watch.polled_directories:
        line += f", {_directories(watch.polled_directories)} polled"
    if watch.overflows:
        line += f", {watch.overflows} overflows"
    return line


def _directories(count: int) -> str:
    return f"{count} director{'y' if count == 1 else 'ies'}"


def _verification_line(status: StatusResult) -> str:
    verification = status.verification
    if verification is None or verification.interval_s is None or status.watcher == "off":
        return "off"
    line = f"every {verification.interval_s:g} s, {verification.runs} runs"
    line += f", {verification.changes_found} changes the watch missed"
    if verification.last_at is not None:
        line += f" (last {_age(verification.last_at)} ago: {verification.last_checked} checked)"
    return line


def _age(unix_s: float) -> str:
    return duration(max(time.time() - unix_s, 0.0))


def session_state(session: Session, now_s: float) -> str:
    """A session's state for people (docs/design.md §13): ``running``, or ``ended 2h ago,
    3 left`` (``ended, 3 left`` when the daemon did not see it end)."""
    if session.state != "ended":
        return session.state
    left = f"{len(session.processes)} left"
    if isinstance(session.ended_at, (int, float)):
        return f"ended {duration(max(now_s - session.ended_at, 0.0))} ago, {left}"
    return f"ended, {left}"


def _what(process: SessionProcess) -> str:
    """What a process is, for people: its command, or its provider and input."""
    if isinstance(process.receipt_command, str):
        return process.receipt_command
    if isinstance(process.provider, str):
        return process.provider + (
            f" ({process.input_id})" if isinstance(process.input_id, str) else ""
        )
    for value in (process.input_id, process.exec_id, process.receipt):
        if isinstance(value, str):
            return value
    if process.kind == "descendant":
        return f"started by pid {process.parent_pid}"
    return "registered process"


def _ids(process: SessionProcess) -> tuple[str, str]:
    """The ``--wide`` columns: the receipt's id (exec id, or input id and provider) and path."""
    if isinstance(process.exec_id, str):
        ident = process.exec_id
    elif isinstance(process.input_id, str):
        provider = f" ({process.provider})" if isinstance(process.provider, str) else ""
        ident = process.input_id + provider
    else:
        ident = "-"
    receipt = process.receipt if isinstance(process.receipt, str) else "-"
    return one_line(ident), one_line(receipt)


def _command(row: Row) -> str:
    process = row.process
    assert isinstance(process, SessionProcess)
    return shown(row, _what(process))


def _aligned(rows: list[tuple[str, ...]], right: frozenset[int] = frozenset()) -> list[str]:
    """Rows with every column but the last padded to its widest cell (``right``: numbers)."""
    count = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(count)]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row[:count], widths, strict=True))
        ]
        lines.append("  ".join([*cells, row[count]]).rstrip())
    return lines


def _with_headings(
    rows: list[tuple[str, ...]],
    headings: list[tuple[int, str]],
    right: frozenset[int] = frozenset(),
) -> list[str]:
    """``rows`` aligned, each of ``headings`` (a session's line) before the row it names
    by index (or last): the headings stand apart, so a long session id widens no column."""
    lines = _aligned(rows, right)
    for index, heading in reversed(headings):
        lines.insert(index, heading)
    return lines


def _heading(session: Session, now_s: float, *, context: bool = True) -> str:
    """A session's own line: its id, its context in brackets (``context``), its state."""
    name = one_line(session.session_id)
    if context and session.context_id:
        name += f" [{one_line(session.context_id)}]"
    return f"{name}  {session_state(session, now_s)}"


def render_sessions(
    snapshot: ActiveSessionsSnapshot,
    *,
    now_s: float | None = None,
    width: int | None = None,
    wide: bool = False,
) -> str:
    """A snapshot as a table for people: sessions and their processes, then the rest.

    Each session is a line of its own: its id, its context, its state
    (``running``, or ``ended 2h ago, 3 left``, docs/design.md §13); under it one row
    per process: kind, pid, age (since the process started), with ``wide`` the
    receipt's id and path, and the command line (docs/design.md §5; what the receipt
    says where the daemon gave none), descendants indented under their parents. Each
    line is cut to ``width`` characters (None, or ``wide``: whole). Then the unowned
    count, the servers, the discovery state and every gap.
    """
    now = time.time() if now_s is None else now_s
    width = None if wide else width
    head: tuple[str, ...] = ("", "KIND", "PID", "AGE")
    rows: list[tuple[str, ...]] = [(*head, *(("ID", "RECEIPT") if wide else ()), "COMMAND")]
    headings: list[tuple[int, str]] = []
    for session in snapshot.sessions:
        headings.append((len(rows), _heading(session, now)))
        for row in tree(session.processes):
            process = row.process
            assert isinstance(process, SessionProcess)
            age = duration(max(now - process.started_at, 0.0))
            ids = _ids(process) if wide else ()
            rows.append(("", process.kind, str(process.pid), age, *ids, _command(row)))
    lines: list[str] = []
    if len(rows) > 1:
        lines.extend(cut(line, width) for line in _with_headings(rows, headings, frozenset({2})))
    else:
        lines.append("no active sessions")
    lines.append("")
    unowned = len(snapshot.unowned)
    lines.append(f"unowned:   {unowned} live receipt{'s' if unowned != 1 else ''} nobody owns")
    for server in snapshot.servers:
        url = f" {inert(server.url)}" if isinstance(server.url, str) else ""
        lines.append(f"server:    pid {server.pid}{url}")
    lines.append(
        f"discovery: {snapshot.discovery} (generation {snapshot.generation}, "
        f"observed {duration(max(now - snapshot.observed_at, 0.0))} ago)"
    )
    lines.extend(f"gap:       {inert(gap)}" for gap in snapshot.gaps)
    return "\n".join(lines)


class ChangePrinter:
    """``sessions.changed`` notifications as text: one JSON document per line
    (``--json``), or a few lines for people per change."""

    def __init__(
        self, *, json_lines: bool = False, width: int | None = None, wide: bool = False
    ) -> None:
        self.json_lines = json_lines
        self.width = None if wide else width
        self.wide = wide
        self._gaps: list[str] = []
        self._unowned = 0
        self._discovery = ""

    def render(self, change: SessionsChanged, *, now_s: float | None = None) -> str:
        """The text for one change, ending with a newline."""
        if self.json_lines:
            return JSON_ENCODER.encode(change).decode() + "\n"
        now = time.time() if now_s is None else now_s
        clock = datetime.fromtimestamp(now).strftime("%H:%M:%S")
        if change.full:
            count = len(change.added)
            head = (
                f"{clock} generation {change.generation}: {count} active "
                f"session{'' if count == 1 else 's'}, discovery {change.discovery}"
            )
        else:
            head = f"{clock} generation {change.generation}"
        lines = [head]
        if said := unsettled(change.discovery, change.gaps):  # its lists are empty, not true
            lines = [f"{clock} generation {change.generation}", *(f"  {line}" for line in said)]
            self._gaps, self._unowned, self._discovery = change.gaps, -1, change.discovery
            return "\n".join(cut(line, self.width) for line in lines) + "\n"
        for mark, sessions in (("+", change.added), ("~", change.changed)):
            for session in sessions:
                lines.extend(_session_lines(mark, session, self.wide, now))
        lines.extend(f"  - {one_line(session_id)}" for session_id in change.removed)
        if change.discovery != self._discovery and not change.full:
            lines.append(f"  discovery {change.discovery}")
        if len(change.unowned) != self._unowned or change.full:
            lines.append(f"  unowned: {len(change.unowned)} live receipts nobody owns")
        if change.gaps != self._gaps:
            lines.extend(f"  gap: {one_line(gap)}" for gap in change.gaps)
            if not change.gaps:
                lines.append("  no gaps")
        self._gaps, self._unowned = change.gaps, len(change.unowned)
        self._discovery = change.discovery
        return "\n".join(cut(line, self.width) for line in lines) + "\n"


def _session_lines(mark: str, session: Session, wide: bool, now_s: float) -> list[str]:
    """A session that was added (``+``) or changed (``~``) with its state, then its
    processes as a tree."""
    name = one_line(session.session_id)
    if session.context_id:
        name += f" [{one_line(session.context_id)}]"
    name += f"  {session_state(session, now_s)}"
    rows: list[tuple[str, ...]] = []
    for row in tree(session.processes):
        process = row.process
        assert isinstance(process, SessionProcess)
        ids = _ids(process) if wide else ()
        rows.append(("    ", process.kind, str(process.pid), *ids, _command(row)))
    return [f"  {mark} {name}", *_aligned(rows)] if rows else [f"  {mark} {name}"]


def _session_cpu(session: Session) -> float:
    """A session's CPU %: its totals', else its processes' added up (an older daemon)."""
    if not isinstance(session.usage, msgspec.UnsetType):
        return session.usage.cpu_percent
    return sum(p.cpu_percent for p in session.processes if isinstance(p.cpu_percent, float))


def _top_order(session: Session) -> tuple[float, bool, str]:
    """``top``'s order: the busiest session first; among equals, an ended session's
    leftovers first (what nobody needs any more), then by id."""
    return (-_session_cpu(session), session.state != "ended", session.session_id)


def render_top(
    snapshot: ActiveSessionsSnapshot,
    *,
    now_s: float | None = None,
    width: int | None = None,
    wide: bool = False,
) -> str:
    """A snapshot measured with ``usage: true`` as a table: a line per session with its
    state and totals (docs/design.md §13), the busiest first, then a row per process,
    its command line last (``wide``: the receipt's id and path before it), each line
    cut to ``width`` characters (None: whole)."""
    now = time.time() if now_s is None else now_s
    width = None if wide else width
    processes = sum(len(session.processes) for session in snapshot.sessions)
    ended = sum(session.state == "ended" for session in snapshot.sessions)
    clock = datetime.fromtimestamp(now).strftime("%H:%M:%S")
    head = (
        f"capsuled top - {clock} - {counted(len(snapshot.sessions), 'session')}"
        f"{f' ({ended} ended)' if ended else ''}, {counted(processes, 'process')}, "
        f"{len(snapshot.unowned)} unowned - discovery {snapshot.discovery}, "
        f"generation {snapshot.generation}"
    )
    columns = ("", "PID", "KIND", "CPU%", "RSS", "AGE")
    rows: list[tuple[str, ...]] = [(*columns, *(("ID", "RECEIPT") if wide else ()), "COMMAND")]
    headings: list[tuple[int, str]] = []
    listed: list[tuple[str, list[SessionProcess]]] = []
    for session in sorted(snapshot.sessions, key=_top_order):
        usage = session.usage
        total = (
            ""
            if isinstance(usage, msgspec.UnsetType)
            else f"  {usage.cpu_percent:.1f}% CPU  {_bytes(usage.rss_bytes)}"
        )
        listed.append((_heading(session, now, context=False) + total, session.processes))
    if snapshot.unowned:
        listed.append(("(unowned)", snapshot.unowned))
    for heading, members in listed:
        headings.append((len(rows), heading))
        for row in tree(members):
            process = row.process
            assert isinstance(process, SessionProcess)
            cpu = process.cpu_percent
            rss = process.rss_bytes
            rows.append(
                (
                    "",
                    str(process.pid),
                    process.kind,
                    "-" if isinstance(cpu, msgspec.UnsetType) else f"{cpu:.1f}",
                    "-" if isinstance(rss, msgspec.UnsetType) else _bytes(rss),
                    duration(max(now - process.started_at, 0.0)),
                    *(_ids(process) if wide else ()),
                    _command(row),
                )
            )
    lines = [head, ""]  # only the rows are cut: the heading's generation stays whole
    if said := unsettled(snapshot.discovery, snapshot.gaps):  # it lists nothing: no table
        return "\n".join([*lines, *said])
    aligned = _with_headings(rows, headings, frozenset({1, 3, 4, 5}))
    lines.extend(cut(line, width) for line in aligned)
    if len(rows) == 1:
        lines.append("no active sessions")
    lines.extend(f"gap: {one_line(gap)}" for gap in snapshot.gaps)
    return "\n".join(lines)


def _bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
