"""``capsulectl``: ask the daemon from a shell (docs/design.md §9). Parsing and dispatch.

Exit status: 0 success, 1 the daemon answered an error (or the reply was
lost or late), 2 bad usage, 3 the daemon is not running.

``--json`` prints the method's result exactly as it came over the wire, one
JSON document; without it, output is for people and may change.

Each command is a module of this package, named as the command, imported only
when the command runs (or its ``--help`` is asked): a command that connects
has ``run(client, args, out) -> int``, one that does not (``run``, ``mcp``)
``run(args, socket_path) -> int``, and either may have ``arguments(parser)``
for its own arguments. The command line is parsed twice: a first look finds
the command, then a parser with that command's arguments (and only those) reads
the whole line; without a command, or for the top-level help, every command is
listed as before.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..wire.constants import DEFAULT_TIMEOUT_S, VERSION
from .exits import EXIT_NOT_RUNNING, EXIT_OK, EXIT_REMOTE_ERROR, EXIT_USAGE
from .options import positive_seconds

# Annotations only: ``capsulectl --version`` does not import ``typing`` (docs/design.md §9).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any, Final, NoReturn, TextIO

    from ..errors import DaemonNotRunning

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


class Command:
    """One ``capsulectl`` command: its help line, and whether ``main`` connects for it.

    Attributes:
        help: what ``--help`` says of it.
        connects: False for a command that runs without a connected client (it
            connects, or goes on, itself): its ``run`` is given the arguments and
            the socket.
    """

    __slots__ = ("connects", "help")

    def __init__(self, help: str, *, connects: bool = True) -> None:
        self.help = help
        self.connects = connects


#: Every command, in the order ``--help`` lists them. A new command is a module of
#: this package named as the command, plus one line here.
COMMANDS: Final[dict[str, Command]] = {
    "ping": Command("check that the daemon answers"),
    "status": Command("the daemon's state, watcher, last observation and counters"),
    "sessions": Command(
        "active sessions with their live processes' command lines, unowned count and gaps"
    ),
    "rescan": Command("make the next observation walk the home from scratch"),
    "metrics": Command("the daemon's metrics in the OpenMetrics text format, as they came"),
    "watch": Command(
        "print changes of the active sessions as they happen, until interrupted "
        "(--json: one sessions.changed document per line)"
    ),
    "top": Command(
        "a live table of sessions and their processes with CPU and memory, "
        "refreshed until interrupted"
    ),
    "reconcile": Command("report (once) the background commands a prior session left unaccounted"),
    "terminate": Command(
        "signal every process of an active session, SIGKILL what is left after the grace"
    ),
    "run": Command(
        "run CMD as a session nothing it starts escapes; report what it left at its exit",
        connects=False,
    ),
    "mcp": Command(
        "an MCP server on stdio: an agent's tools to see (and, with --allow-terminate, "
        "stop) what its session runs; needs the extra capsuled[mcp]",
        connects=False,
    ),
}

#: The longest ``--timeout``: a day (a socket timeout past about 9e9 s cannot be set at all).
TIMEOUT_MAX_S: Final = 86400.0


def command_module(name: str) -> Any:
    """The module of the command ``name``, imported now."""
    return importlib.import_module(f"{__package__}.{name}")


def _timeout_s(text: str) -> float:
    """``--timeout``: positive seconds, at most a day."""
    return positive_seconds(text, TIMEOUT_MAX_S)


def _socket_path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the socket path must not be empty")
    return text


def _common() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name."""
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
    return common


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``capsulectl`` command line.

    Args:
        command: the command about to run: only it is listed, with its own
            arguments (its module is imported). None: every command is listed,
            none with its own arguments (for the top-level help and errors).
    """
    common = _common()
    parser = argparse.ArgumentParser(
        prog="capsulectl",
        parents=[common],
        description="Ask capsuled which sessions are alive and what resumed sessions lost.",
        epilog="Exit status: 0 success, 1 the daemon answered an error, 2 bad usage, "
        "3 the daemon is not running.",
    )
    parser.add_argument(
        "--version", action="version", version=f"capsulectl {VERSION}", help="print it and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS if command is None else (command,):
        text = COMMANDS[name].help
        subparser = sub.add_parser(name, parents=[common], help=text, description=text)
        if command is not None:
            arguments = getattr(command_module(name), "arguments", None)
            if arguments is not None:
                arguments(subparser)
    return parser


class _Unparsed(Exception):
    """The first look could not read the command line: the whole parser says why."""


class _FirstLook(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's prints and exits
        raise _Unparsed(message)


def _command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs, found without any command's own arguments; None when
    there is none, the top-level help is asked, or the line cannot be read that way."""
    look = _FirstLook(prog="capsulectl", add_help=False)
    look.add_argument("-h", "--help", action="store_true")
    look.add_argument("--version", action="store_true")
    look.add_argument("--socket")
    look.add_argument("--json", action="store_true")
    look.add_argument("--timeout")
    look.add_argument("command", nargs="?")
    look.add_argument("rest", nargs=argparse.REMAINDER)
    try:
        first, _ = look.parse_known_args(argv)
    except _Unparsed:
        return None
    if first.help or first.version or first.command not in COMMANDS:
        return None
    if "--" in argv[: argv.index(first.command)]:
        return None  # argparse reads a "--" before the command as the command
    return str(first.command)


def _lock_holder(socket_path: Path) -> int | None:
    """The pid a daemon wrote in its lock file, if a process with that pid runs.

    A daemon empties the file when it stops cleanly; one killed leaves its pid,
    which another process may have taken since: callers say "if it is capsuled".
    """
    from ..kit.paths import lock_path_for

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
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_named(argv)
    try:
        args = build_parser(command).parse_args(argv)
        if command is None:  # found by the whole parser only: read again with its arguments
            args = build_parser(args.command).parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    options: dict[str, Any] = {"socket": None, "json": False, "timeout": DEFAULT_TIMEOUT_S}
    options.update({k: v for k, v in vars(args).items() if k in options})
    args.json = options["json"]
    return _dispatch(args, options, out)


def _dispatch(args: argparse.Namespace, options: dict[str, Any], out: TextIO) -> int:
    """Run the command ``args`` names, connected first unless it connects itself."""
    from pathlib import Path

    from ..kit.paths import MAX_SOCKET_PATH_BYTES, default_socket

    socket_path = default_socket() if options["socket"] is None else Path(options["socket"])
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH_BYTES:
        print(
            f"capsulectl: socket path {socket_path} is longer than the {MAX_SOCKET_PATH_BYTES} "
            "bytes a Unix socket allows; choose a shorter --socket or $CAPSULED_SOCKET",
            file=sys.stderr,
        )
        return EXIT_USAGE
    command = command_module(args.command)
    if not COMMANDS[args.command].connects:
        if args.json:  # run and mcp print no result of a method: nothing to print as JSON
            print(f"capsulectl: --json does not apply to {args.command}", file=sys.stderr)
            return EXIT_USAGE
        code: int = command.run(args, socket_path)
        return code
    from ..client import Client
    from ..errors import CapsuleError, DaemonNotRunning, RemoteError
    from .render.output import quiet_stdout

    try:
        with Client(socket_path, timeout_s=options["timeout"]) as client:
            code = command.run(client, args, out)
            out.flush()  # a closed pipe is noticed here, not at the exit's flush
            return code
    except BrokenPipeError:  # `capsulectl sessions --json | head -c 100`: the reader left
        quiet_stdout(out)
        return EXIT_OK
    except DaemonNotRunning as exc:
        return _not_running(exc)
    except RemoteError as exc:
        print(f"capsulectl: the daemon answered error {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_REMOTE_ERROR
    except CapsuleError as exc:
        print(f"capsulectl: {exc}", file=sys.stderr)
        return EXIT_REMOTE_ERROR


def _not_running(exc: DaemonNotRunning) -> int:
    """Say that no daemon answers and how to start one (or which pid still holds its lock)."""
    from ..kit.paths import lock_path_for

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
