"""``capsulectl``: ask the daemon from a shell (docs/design.md §9).

Exit status: 0 success, 1 the daemon answered an error (or the reply was
lost or late), 2 bad usage, 3 the daemon is not running.

``--json`` prints the method's result exactly as it came over the wire, one
JSON document; without it, output is for people and may change.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, TextIO

from . import _core
from ._client import Client
from ._core import DEFAULT_TIMEOUT_S
from ._exceptions import CapsuleError, DaemonNotRunning, RemoteError
from ._follow import follow_changes, follow_top
from ._render import print_json, quiet_stdout, render_reconcile, render_sessions, render_status
from ._render_terminate import terminate_arguments, terminate_command
from ._render_tree import terminal_width, wide_argument
from ._run_cli import run_arguments, run_command
from .paths import MAX_SOCKET_PATH_BYTES, default_socket, lock_path_for

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_REMOTE_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_RUNNING: Final = 3

#: A command: runs against a connected client, prints to ``out``, returns the exit status.
Command = Callable[[Client, argparse.Namespace, TextIO], int]
#: Adds a command's own arguments to its subparser.
Arguments = Callable[[argparse.ArgumentParser], None]


class Subcommand(NamedTuple):
    """One ``capsulectl`` command: what runs it, its help line, and its own arguments."""

    run: Command
    help: str
    arguments: Arguments | None = None


class Standalone(NamedTuple):
    """A command that runs without a connected client (it connects, or goes on, itself):
    given the arguments and the socket, it returns the exit status."""

    run: Callable[[argparse.Namespace, Path], int]
    help: str
    arguments: Arguments | None = None


def _ping(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        print_json(out, client.call_raw("ping"))
        return EXIT_OK
    result = client.ping()
    print(f"capsuled {result.version} is running on {client.socket_path}", file=out)
    return EXIT_OK


def _status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        print_json(out, client.call_raw("status"))
        return EXIT_OK
    print(render_status(client.status()), file=out)
    return EXIT_OK


def _reconcile(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    call = _core.reconcile(args.from_session, args.this_session, args.context_id)
    if args.json:
        print_json(out, client.call_raw(call.method, call.params, min_timeout_s=call.min_timeout_s))
        return EXIT_OK
    report = client.reconcile(args.from_session, args.this_session, args.context_id)
    print(render_reconcile(args.from_session, report), file=out)
    return EXIT_OK


def _sessions(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    # Read-your-writes: a runtime that just wrote a receipt sees it here.
    if args.json:
        params = {"max_age_ms": 0, "commands": True}
        print_json(out, client.call_raw("sessions.snapshot", params))
        return EXIT_OK
    snapshot = client.snapshot(fresh=True, commands=True)
    width = None if args.wide else terminal_width(out)
    print(render_sessions(snapshot, width=width, wide=args.wide), file=out)
    return EXIT_OK


def _rescan(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        print_json(out, client.call_raw("reader.rescan"))
        return EXIT_OK
    client.rescan()
    print("rescan scheduled: the next observation walks the home from scratch", file=out)
    return EXIT_OK


def _watch(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    follow_changes(client, out, json_lines=args.json, wide=args.wide)
    return EXIT_OK


def _top(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    follow_top(
        client, out, interval_s=args.interval, once=args.once, json=args.json, wide=args.wide
    )
    return EXIT_OK


def _metrics(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        print_json(out, client.call_raw("metrics"))
        return EXIT_OK
    out.write(client.metrics().text)
    return EXIT_OK


def _mcp(args: argparse.Namespace, socket_path: Path) -> int:
    """The MCP server on stdio (docs/design.md §11), until the agent host closes it.

    The SDK is imported here and nowhere else: the other commands never load it.
    """
    try:
        from ._mcp import SESSION_VARIABLE, McpOptions, serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith(__package__ or "capsule_client"):
            raise
        print(
            f"capsulectl: `capsulectl mcp` needs the MCP SDK ({exc}). Install the extra: "
            "`pip install 'capsuled[mcp]'` (with pipx: `pipx inject capsuled mcp`).",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import anyio

    options = McpOptions(
        socket_path,
        timeout_s=getattr(args, "timeout", DEFAULT_TIMEOUT_S),
        allow_terminate=args.allow_terminate,
        any_session=args.any_session,
        session_id=os.environ.get(SESSION_VARIABLE) or None,
    )
    try:
        anyio.run(lambda: serve(options, version=_version()))
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _mcp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-terminate",
        action="store_true",
        help="offer the tool terminate_session, which stops every process of a session",
    )
    parser.add_argument(
        "--any-session",
        action="store_true",
        help="let terminate_session stop any session, not only the one in $CAPSULE_SESSION_ID",
    )


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
    wide_argument(parser)
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


#: Every command, in the order ``--help`` lists them. A new command is its
#: function (and its arguments' function, if it takes any) plus one line here.
COMMANDS: Final[dict[str, Subcommand | Standalone]] = {
    "ping": Subcommand(_ping, "check that the daemon answers"),
    "status": Subcommand(_status, "the daemon's state, watcher, last observation and counters"),
    "sessions": Subcommand(
        _sessions,
        "active sessions with their live processes' command lines, unowned count and gaps",
        wide_argument,
    ),
    "rescan": Subcommand(_rescan, "make the next observation walk the home from scratch"),
    "metrics": Subcommand(
        _metrics, "the daemon's metrics in the OpenMetrics text format, as they came"
    ),
    "watch": Subcommand(
        _watch,
        "print changes of the active sessions as they happen, until interrupted "
        "(--json: one sessions.changed document per line)",
        wide_argument,
    ),
    "top": Subcommand(
        _top,
        "a live table of sessions and their processes with CPU and memory, "
        "refreshed until interrupted",
        _top_arguments,
    ),
    "reconcile": Subcommand(
        _reconcile,
        "report (once) the background commands a prior session left unaccounted",
        _reconcile_arguments,
    ),
    "terminate": Subcommand(
        terminate_command,
        "signal every process of an active session, SIGKILL what is left after the grace",
        terminate_arguments,
    ),
    "run": Standalone(
        run_command,
        "run CMD as a session nothing it starts escapes; report what it left at its exit",
        run_arguments,
    ),
    "mcp": Standalone(
        _mcp,
        "an MCP server on stdio: an agent's tools to see (and, with --allow-terminate, "
        "stop) what its session runs; needs the extra capsuled[mcp]",
        _mcp_arguments,
    ),
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


def _version() -> str:
    """The installed distribution's version (the daemon's too: they ship together)."""
    import importlib.metadata  # only for --version: it costs every other command its import

    try:
        return importlib.metadata.version("capsuled")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"


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
    parser.add_argument(
        "--version", action="version", version=f"capsulectl {_version()}", help="print it and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, subcommand in COMMANDS.items():
        command = sub.add_parser(
            name, parents=[common], help=subcommand.help, description=subcommand.help
        )
        if subcommand.arguments is not None:
            subcommand.arguments(command)
    return parser


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
    entry = COMMANDS[args.command]
    socket_path = default_socket() if options["socket"] is None else Path(options["socket"])
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH_BYTES:
        print(
            f"capsulectl: socket path {socket_path} is longer than the {MAX_SOCKET_PATH_BYTES} "
            "bytes a Unix socket allows; choose a shorter --socket or $CAPSULED_SOCKET",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if isinstance(entry, Standalone):
        if args.json:  # run and mcp print no result of a method: nothing to print as JSON
            print(f"capsulectl: --json does not apply to {args.command}", file=sys.stderr)
            return EXIT_USAGE
        return entry.run(args, socket_path)
    try:
        with Client(socket_path, timeout_s=options["timeout"]) as client:
            code = entry.run(client, args, out)
            out.flush()  # a closed pipe is noticed here, not at the exit's flush
            return code
    except BrokenPipeError:  # `capsulectl sessions --json | head -c 100`: the reader left
        quiet_stdout(out)
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
