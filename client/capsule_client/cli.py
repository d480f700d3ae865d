"""``capsulectl``: ask the daemon from a shell (docs/design.md §1).

Exit status: 0 success, 1 the daemon answered an error (or the reply was
lost or late), 2 bad usage, 3 the daemon is not running.

``--json`` prints the method's result exactly as it came over the wire, one
JSON document; without it, output is for people and may change.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

import msgspec

from . import _core
from ._client import Client
from ._core import DEFAULT_TIMEOUT_S
from ._exceptions import (
    CapsuleError,
    ConnectionLost,
    DaemonNotRunning,
    Overloaded,
    RemoteError,
    RequestTimeout,
    ShuttingDown,
    SubscriptionDropped,
)
from ._render_terminate import terminate_arguments, terminate_command
from ._render_tree import indent, nested
from .paths import MAX_SOCKET_PATH_BYTES, default_socket, lock_path_for
from .protocol import (
    ActiveSessionsSnapshot,
    LostReport,
    Session,
    SessionProcess,
    SessionsChanged,
    StatusResult,
)

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_REMOTE_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_RUNNING: Final = 3

Command = Callable[[Client, argparse.Namespace, TextIO], int]

_json_encoder: Final = msgspec.json.Encoder()


def _ping(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        _print_json(out, client.call_raw("ping"))
        return EXIT_OK
    result = client.ping()
    print(f"capsuled {result.version} is running on {client.socket_path}", file=out)
    return EXIT_OK


def _status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        _print_json(out, client.call_raw("status"))
        return EXIT_OK
    print(render_status(client.status()), file=out)
    return EXIT_OK


def render_status(status: StatusResult) -> str:
    """``status`` as aligned ``key: value`` lines for people."""
    if status.discovery is None:
        discovery = "no observation yet"
    else:
        age = "" if status.last_observed_at is None else _age(status.last_observed_at)
        discovery = f"{status.discovery}" + (f" (observed {age} ago)" if age else "")
    totals = status.totals
    rows = [
        ("daemon", f"capsuled {status.version}, pid {status.pid}, up {_duration(status.uptime_s)}"),
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


def _reconcile(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    call = _core.reconcile(args.from_session, args.this_session, args.context_id)
    if args.json:
        _print_json(
            out, client.call_raw(call.method, call.params, min_timeout_s=call.min_timeout_s)
        )
        return EXIT_OK
    report = client.reconcile(args.from_session, args.this_session, args.context_id)
    print(render_reconcile(args.from_session, report), file=out)
    return EXIT_OK


def render_reconcile(from_session: str, report: LostReport | None) -> str:
    """A ``session.reconcile`` result for people: a heading and one row per lost work."""
    if report is None:
        return (
            f"Nothing to report: session {from_session} has no background command left "
            "unaccounted (every detached command completed, was abandoned, or was already "
            "reported lost)."
        )
    count = len(report.lost)
    heading = (
        f"Session {report.started_in_session} left {count} background "
        f"command{'' if count == 1 else 's'} unaccounted; now marked lost in its trace.\n"
        f"task {report.task_id}, trust {report.provenance.trust}, context {report.context_id}"
    )
    rows = [("WORK", "DETACHED (UTC)", "BINARY", "COMMAND")]
    rows.extend(
        (
            _one_line(work.work_id),
            _detach_time(work.detached_at_ms),
            _one_line(work.binary),
            _one_line(work.command),
        )
        for work in report.lost
    )
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    table = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  "
        + row[3]
        for row in rows
    ]
    return "\n".join([heading, "", *table])


def _detach_time(detached_at_ms: int) -> str:
    if detached_at_ms == 0:
        return "unknown"
    try:
        when = datetime.fromtimestamp(detached_at_ms / 1000, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return f"{detached_at_ms} ms"
    return when.strftime("%Y-%m-%d %H:%M:%S")


#: Characters a terminal would act on (C0, DEL, C1), Unicode line and
#: paragraph separators, and the bidi marks, embeddings, overrides and
#: isolates (U+200E-200F, U+202A-202E, U+2066-2069), which rearrange how the
#: rest of a line reads on screen.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return _NAMED_ESCAPES.get(match[0], f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def _inert(text: str) -> str:
    """``text`` with control characters (and bidi and line-separator ones) spelt as
    escapes, so it is one inert line.

    Commands, binaries and file names come from receipts and traces, which a
    model's output can reach; printed raw, an escape sequence would act on
    the reader's terminal and a newline would break the table.
    """
    return _CONTROL.sub(_escape, text)


def _one_line(text: str) -> str:
    """:func:`_inert`, with backslashes doubled so that every escape is unambiguous."""
    return _inert(text.replace("\\", "\\\\"))


def _age(unix_s: float) -> str:
    return _duration(max(time.time() - unix_s, 0.0))


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
    return f"{seconds // 86400:.0f}d{seconds % 86400 // 3600:02.0f}h"


def _sessions(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    # Read-your-writes: a runtime that just wrote a receipt sees it here.
    if args.json:
        _print_json(out, client.call_raw("sessions.snapshot", {"max_age_ms": 0}))
        return EXIT_OK
    print(render_sessions(client.snapshot(fresh=True)), file=out)
    return EXIT_OK


def _rescan(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        _print_json(out, client.call_raw("reader.rescan"))
        return EXIT_OK
    client.rescan()
    print("rescan scheduled: the next observation walks the home from scratch", file=out)
    return EXIT_OK


def _what(process: SessionProcess) -> str:
    """What a process is, for people: its command, or its provider and input."""
    if isinstance(process.command, str):
        return process.command
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


def render_sessions(snapshot: ActiveSessionsSnapshot, *, now_s: float | None = None) -> str:
    """A snapshot as a table for people: sessions and their processes, then the rest.

    Columns: session, kind, pid, age (since the process started), and what
    it runs (the command, or the provider and input). Then the unowned count,
    the servers, the discovery state and every gap.
    """
    now = time.time() if now_s is None else now_s
    rows: list[tuple[str, ...]] = [("SESSION", "KIND", "PID", "AGE", "COMMAND / PROVIDER")]
    for session in snapshot.sessions:
        name = _one_line(session.session_id)
        if session.context_id:
            name += f" [{_one_line(session.context_id)}]"
        for depth, process in nested(session.processes):
            age = _duration(max(now - process.started_at, 0.0))
            what = indent(depth) + _one_line(_what(process))
            rows.append((name, process.kind, str(process.pid), age, what))
            name = ""
    lines = []
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            lines.append("  ".join([*cells, row[4]]).rstrip())
    else:
        lines.append("no active sessions")
    lines.append("")
    unowned = len(snapshot.unowned)
    lines.append(f"unowned:   {unowned} live receipt{'s' if unowned != 1 else ''} nobody owns")
    for server in snapshot.servers:
        url = f" {_inert(server.url)}" if isinstance(server.url, str) else ""
        lines.append(f"server:    pid {server.pid}{url}")
    lines.append(
        f"discovery: {snapshot.discovery} (generation {snapshot.generation}, "
        f"observed {_duration(max(now - snapshot.observed_at, 0.0))} ago)"
    )
    lines.extend(f"gap:       {_inert(gap)}" for gap in snapshot.gaps)
    return "\n".join(lines)


#: Seconds between two attempts to reach a daemon that went away under ``watch``.
WATCH_RECONNECT_INTERVAL_S: Final = 0.2

#: What ends a ``watch`` or ``top`` connection without ending the command: the
#: daemon restarting, or too busy to take the connection (-32002) for now.
_RECONNECT_ON: Final = (ConnectionLost, DaemonNotRunning, ShuttingDown, Overloaded)


def _watch(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """``capsulectl watch``: print every change until interrupted.

    A daemon that goes away after the first answer (a restart, an upgrade)
    does not end the watch: it reconnects, and the new subscription starts
    with the whole answer again (``full``). A daemon that is not there at the
    start ends it with exit status 3, as for every other command.
    """
    printer = ChangePrinter(json_lines=args.json)
    answered = False
    try:
        while True:
            try:
                for change in client.subscribe():
                    answered = True
                    out.write(printer.render(change))
                    out.flush()
            except SubscriptionDropped as exc:
                # The next subscription starts with the whole answer again.
                print(f"capsulectl: {exc}; subscribing again", file=sys.stderr)
            except _RECONNECT_ON as exc:
                if not answered:
                    raise
                print(f"capsulectl: {exc}; reconnecting", file=sys.stderr)
                _wait_for_daemon(client)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # `capsulectl watch | head`
        _quiet_stdout(out)
        return EXIT_OK


def _wait_for_daemon(client: Client) -> None:
    """Ping until a daemon answers on the client's socket (for ever: Ctrl-C ends it)."""
    while True:
        try:
            client.ping()
            return
        except (*_RECONNECT_ON, RequestTimeout):
            time.sleep(WATCH_RECONNECT_INTERVAL_S)


def _snapshot_again(client: Client) -> ActiveSessionsSnapshot:
    """``top``'s first answer from a daemon that came back (it may go away again meanwhile)."""
    while True:
        _wait_for_daemon(client)
        try:
            return client.snapshot(usage=True)
        except _RECONNECT_ON:
            continue


def _lock_holder(socket_path: Path) -> int | None:
    """The pid a daemon wrote in its lock file, if a process with that pid runs.

    A daemon empties the file when it stops cleanly; one killed leaves its pid,
    which another process may have taken since: callers say "if it is capsuled".
    """
    try:
        pid = int(lock_path_for(socket_path).read_text(encoding="ascii").strip())
        if pid <= 0:
            return None
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _quiet_stdout(out: TextIO) -> None:
    """After EPIPE on stdout, point it at /dev/null so the exit flush stays quiet."""
    if out is sys.stdout:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class ChangePrinter:
    """``sessions.changed`` notifications as text: one JSON document per line
    (``--json``), or a few lines for people per change."""

    def __init__(self, *, json_lines: bool = False) -> None:
        self.json_lines = json_lines
        self._gaps: list[str] = []
        self._unowned = 0
        self._discovery = ""

    def render(self, change: SessionsChanged, *, now_s: float | None = None) -> str:
        """The text for one change, ending with a newline."""
        if self.json_lines:
            return _json_encoder.encode(change).decode() + "\n"
        clock = datetime.fromtimestamp(time.time() if now_s is None else now_s).strftime("%H:%M:%S")
        if change.full:
            count = len(change.added)
            head = (
                f"{clock} generation {change.generation}: {count} active "
                f"session{'' if count == 1 else 's'}, discovery {change.discovery}"
            )
        else:
            head = f"{clock} generation {change.generation}"
        lines = [head]
        lines.extend(f"  + {_session_line(session)}" for session in change.added)
        lines.extend(f"  ~ {_session_line(session)}" for session in change.changed)
        lines.extend(f"  - {_one_line(session_id)}" for session_id in change.removed)
        if change.discovery != self._discovery and not change.full:
            lines.append(f"  discovery {change.discovery}")
        if len(change.unowned) != self._unowned or change.full:
            lines.append(f"  unowned: {len(change.unowned)} live receipts nobody owns")
        if change.gaps != self._gaps:
            lines.extend(f"  gap: {_one_line(gap)}" for gap in change.gaps)
            if not change.gaps:
                lines.append("  no gaps")
        self._gaps, self._unowned = change.gaps, len(change.unowned)
        self._discovery = change.discovery
        return "\n".join(lines) + "\n"


def _session_line(session: Session) -> str:
    name = _one_line(session.session_id)
    if session.context_id:
        name += f" [{_one_line(session.context_id)}]"
    processes = ", ".join(
        f"{process.kind} {process.pid} ({_one_line(_what(process))})"
        for process in session.processes
    )
    return f"{name}: {processes}"


def _top(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    interval_s: float = max(args.interval, 0.05)
    clear = not args.once and out.isatty()
    try:
        snapshot = client.snapshot(usage=True, fresh=args.once)
        if args.once:  # CPU use is measured between two looks; the last one reads your writes
            time.sleep(min(interval_s, 1.0))
            snapshot = client.snapshot(usage=True, fresh=True)
        while True:
            text = render_top(snapshot)
            if args.json:
                text = _json_encoder.encode(snapshot).decode()
            out.write(("\x1b[H\x1b[2J" if clear else "") + text + "\n")
            out.flush()
            if args.once:
                return EXIT_OK
            try:
                # Wakes at once when the answer changes, else after the interval.
                snapshot = client.snapshot(
                    usage=True, since=snapshot.generation, timeout_ms=round(interval_s * 1000)
                )
            except _RECONNECT_ON as exc:
                # A restart: the new daemon's generations start elsewhere.
                print(f"capsulectl: {exc}; reconnecting", file=sys.stderr)
                snapshot = _snapshot_again(client)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        _quiet_stdout(out)
        return EXIT_OK


def render_top(snapshot: ActiveSessionsSnapshot, *, now_s: float | None = None) -> str:
    """A snapshot measured with ``usage: true`` as a table: one row per process."""
    now = time.time() if now_s is None else now_s
    processes = sum(len(session.processes) for session in snapshot.sessions)
    clock = datetime.fromtimestamp(now).strftime("%H:%M:%S")
    head = (
        f"capsuled top - {clock} - {len(snapshot.sessions)} sessions, {processes} processes, "
        f"{len(snapshot.unowned)} unowned - discovery {snapshot.discovery}, "
        f"generation {snapshot.generation}"
    )
    rows: list[tuple[str, ...]] = [("SESSION", "PID", "KIND", "CPU%", "RSS", "AGE", "COMMAND")]
    listed = [(_one_line(s.session_id), s.processes) for s in snapshot.sessions]
    if snapshot.unowned:
        listed.append(("(unowned)", snapshot.unowned))
    for name, members in listed:
        for depth, process in nested(members):
            cpu = process.cpu_percent
            rss = process.rss_bytes
            rows.append(
                (
                    name,
                    str(process.pid),
                    process.kind,
                    "-" if isinstance(cpu, msgspec.UnsetType) else f"{cpu:.1f}",
                    "-" if isinstance(rss, msgspec.UnsetType) else _bytes(rss),
                    _duration(max(now - process.started_at, 0.0)),
                    indent(depth) + _one_line(_what(process)),
                )
            )
            name = ""
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    right = {1, 3, 4, 5}
    lines = [head, ""]
    for row in rows:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append("  ".join([*cells, row[6]]).rstrip())
    if len(rows) == 1:
        lines.append("no active sessions")
    lines.extend(f"gap: {_one_line(gap)}" for gap in snapshot.gaps)
    return "\n".join(lines)


def _bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _print_json(out: TextIO, raw: bytes) -> None:
    out.write(raw.decode())
    out.write("\n")


COMMANDS: dict[str, tuple[Command, str]] = {
    "ping": (_ping, "check that the daemon answers"),
    "status": (_status, "the daemon's state, watcher, last observation and counters"),
    "sessions": (_sessions, "active sessions with their live processes, unowned count and gaps"),
    "rescan": (_rescan, "make the next observation walk the home from scratch"),
    "watch": (
        _watch,
        "print changes of the active sessions as they happen, until interrupted "
        "(--json: one sessions.changed document per line)",
    ),
    "top": (
        _top,
        "a live table of sessions and their processes with CPU and memory, "
        "refreshed until interrupted",
    ),
    "reconcile": (
        _reconcile,
        "report (once) the background commands a prior session left unaccounted",
    ),
    "terminate": (
        terminate_command,
        "signal every process of an active session, SIGKILL what is left after the grace",
    ),
}


def _reconcile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("from_session", metavar="FROM", help="the prior session, ses_...")
    parser.add_argument(
        "--as",
        dest="this_session",
        metavar="THIS",
        required=True,
        help="the session resuming it (recorded in the markers; asking again "
        "with the same THIS returns the same report)",
    )
    parser.add_argument(
        "--context", dest="context_id", metavar="CTX", required=True, help="echoed in the report"
    )


def _top_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        metavar="S",
        type=_interval_s,
        default=2.0,
        help="seconds between two refreshes, at most 3600; a change of the answer refreshes "
        "at once (default: 2)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one table (CPU measured over --interval, at most 1 s) and exit",
    )


#: Arguments of the commands that take some.
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "reconcile": _reconcile_arguments,
    "top": _top_arguments,
    "terminate": terminate_arguments,
}


#: The longest ``--timeout``: a day (a socket timeout past about 9e9 s cannot be set at all).
TIMEOUT_MAX_S: Final = 86400.0
#: The longest ``top --interval``: the daemon's longest long poll (``timeout_ms``).
TOP_INTERVAL_MAX_S: Final = 3600.0


def _seconds(text: str, max_s: float) -> float:
    """Positive seconds, at most ``max_s`` (else a usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    if value > max_s:
        raise argparse.ArgumentTypeError(f"must be at most {max_s:g} seconds, not {text!r}")
    return value


def _timeout_s(text: str) -> float:
    """``--timeout``: positive seconds, at most a day."""
    return _seconds(text, TIMEOUT_MAX_S)


def _interval_s(text: str) -> float:
    """``top --interval``: positive seconds, at most an hour."""
    return _seconds(text, TOP_INTERVAL_MAX_S)


def _socket_path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the socket path must not be empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The ``capsulectl`` command line."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--socket",
        metavar="PATH",
        type=_socket_path,
        default=argparse.SUPPRESS,
        help="the daemon's socket (default: $CAPSULED_SOCKET, else "
        "$XDG_RUNTIME_DIR/capsuled.sock, else HOME/capsuled.sock where HOME is "
        "$CAPSULE_HOME, else $XDG_STATE_HOME/capsule, else ~/.local/state/capsule)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the result exactly as the daemon sent it, one JSON document",
    )
    common.add_argument(
        "--timeout",
        metavar="S",
        type=_timeout_s,
        default=argparse.SUPPRESS,
        help=f"seconds to wait for a reply, at most {TIMEOUT_MAX_S:g} "
        f"(default: {DEFAULT_TIMEOUT_S:g})",
    )
    parser = argparse.ArgumentParser(
        prog="capsulectl",
        parents=[common],
        description="Ask capsuled which sessions are alive and what resumed sessions lost.",
        epilog="Exit status: 0 success, 1 the daemon answered an error, 2 bad usage, "
        "3 the daemon is not running.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in COMMANDS.items():
        command = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        if name in ARGUMENTS:
            ARGUMENTS[name](command)
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run ``capsulectl``; returns the exit status.

    Args:
        argv: the arguments (without the program name); default ``sys.argv[1:]``.
        out: where results go; default ``sys.stdout``. Errors go to ``sys.stderr``.
    """
    out = sys.stdout if out is None else out
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    options: dict[str, Any] = {"socket": None, "json": False, "timeout": DEFAULT_TIMEOUT_S}
    options.update({k: v for k, v in vars(args).items() if k in options})
    args.json = options["json"]
    command, _ = COMMANDS[args.command]
    socket_path = default_socket() if options["socket"] is None else Path(options["socket"])
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH_BYTES:
        print(
            f"capsulectl: socket path {socket_path} is longer than the {MAX_SOCKET_PATH_BYTES} "
            "bytes a Unix socket allows; choose a shorter --socket or $CAPSULED_SOCKET",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        with Client(socket_path, timeout_s=options["timeout"]) as client:
            code = command(client, args, out)
            out.flush()  # a closed pipe is noticed here, not at the exit's flush
            return code
    except BrokenPipeError:  # `capsulectl sessions --json | head -c 100`: the reader left
        _quiet_stdout(out)
        return EXIT_OK
    except DaemonNotRunning as exc:
        holder = _lock_holder(exc.socket_path)
        if holder is not None:
            print(
                f"capsulectl: nothing accepts connections on {exc.socket_path} ({exc.reason}), "
                f"but pid {holder}, named in {lock_path_for(exc.socket_path)}, still runs.\n"
                "If it is capsuled, its socket was removed (a clean-up of /tmp?): it binds it "
                "again within a few seconds. If it does not (a capsuled older than that, or "
                f"one that is stuck), stop it (`kill {holder}`), then start capsuled again.",
                file=sys.stderr,
            )
            return EXIT_NOT_RUNNING
        print(
            f"capsulectl: capsuled is not running: nothing accepts connections on "
            f"{exc.socket_path} ({exc.reason}).\n"
            "Start it with `capsuled` (foreground) or `systemctl --user start capsuled`, "
            "or point --socket / $CAPSULED_SOCKET at the socket it serves.",
            file=sys.stderr,
        )
        return EXIT_NOT_RUNNING
    except RemoteError as exc:
        print(f"capsulectl: the daemon answered error {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_REMOTE_ERROR
    except CapsuleError as exc:
        print(f"capsulectl: {exc}", file=sys.stderr)
        return EXIT_REMOTE_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
