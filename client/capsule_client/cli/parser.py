"""``capsulectl``'s command line: the command table, the options every command takes,
and the parser (docs/design.md §9).

The command line is read twice: a first look finds the command, then a parser
with that command's own arguments (and only those: its module is imported for
them) reads the whole line; without a command, or for the top-level help,
every command is listed, none with its arguments.
"""

from __future__ import annotations

import argparse
import sys

from ..wire.constants import DEFAULT_TIMEOUT_S, VERSION
from .exits import EXIT_OK, EXIT_USAGE
from .options import positive_seconds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Final, NoReturn

__all__ = ["COMMANDS", "Command", "build_parser", "command_module", "parse"]


class Command:
    """One ``capsulectl`` command: its help line, and whether ``main`` connects for it.

    Attributes:
        help: what ``--help`` says of it.
        connects: False for a command that runs without a connected client (it
            connects, or goes on, itself): its ``run`` is given the arguments and
            the socket.
        timeout_s: its ``--timeout`` unless one is given.
        checks_socket: False for a command a socket path too long for a Unix socket
            must not stop: one that never asks the daemon (``service``, ``integrate``),
            or one that must go on without the daemon (``hook``, which fails open).
    """

    __slots__ = ("checks_socket", "connects", "help", "timeout_s")

    def __init__(
        self,
        help: str,
        *,
        connects: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        checks_socket: bool = True,
    ) -> None:
        self.help = help
        self.connects = connects
        self.timeout_s = timeout_s
        self.checks_socket = checks_socket


#: Every command, in the order ``--help`` lists them. A new command is a module of
#: this package named as the command, plus one line here.
COMMANDS: Final[dict[str, Command]] = {
    "ping": Command("check that the daemon answers"),
    "status": Command("the daemon's state, watcher, last observation and counters"),
    "sessions": Command(
        "active sessions with their live processes' command lines, unowned count and gaps"
    ),
    "ports": Command(
        "the ports the sessions' processes listen on; with PORT, which session holds it"
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
        "signal every process of an active session, SIGKILL what is left after the grace; "
        "--ended: every ended session's leftovers"
    ),
    "run": Command(
        "run CMD as a session nothing it starts escapes; report what it left at its exit",
        connects=False,
        timeout_s=10.0,  # its ping at start and its look at CMD's exit (docs/design.md §10)
    ),
    "mcp": Command(
        "an MCP server on stdio: an agent's tools to see (and, with --allow-terminate, "
        "stop) what its session runs; needs the extra capsuled[mcp]",
        connects=False,
    ),
    "service": Command(
        "install (or uninstall) capsuled as your service: systemd user units, or a "
        "launchd agent on macOS",
        connects=False,
        checks_socket=False,
    ),
    "hook": Command(
        "record one hook event of an agent (claude-code), read on stdin; always exits 0",
        connects=False,
        checks_socket=False,
    ),
    "integrate": Command(
        "register capsuled's hooks and MCP server in an agent's settings (claude-code), "
        "or --remove them",
        connects=False,
        checks_socket=False,
    ),
}

#: The longest ``--timeout``: a day (a socket timeout past about 9e9 s cannot be set at all).
TIMEOUT_MAX_S: Final = 86400.0


def command_module(name: str) -> Any:
    """The module of the command ``name``, imported now.

    ``__import__``, not ``importlib.import_module``: it is the import statement's own
    path, the one ``python -X importtime`` times, so the command's imports show there.
    """
    qualified = f"{__package__}.{name}"
    __import__(qualified)
    return sys.modules[qualified]


def _timeout_s(text: str) -> float:
    """``--timeout``: positive seconds, at most a day."""
    return positive_seconds(text, TIMEOUT_MAX_S)


def _socket_path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the socket path must not be empty")
    return text


def _common(timeout_s: float = DEFAULT_TIMEOUT_S) -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (``timeout_s``: the
    command's own ``--timeout`` default)."""
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
        help=f"seconds to wait for a reply, at most {TIMEOUT_MAX_S:g} (default: {timeout_s:g})",
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
        subparser = sub.add_parser(
            name, parents=[_common(COMMANDS[name].timeout_s)], help=text, description=text
        )
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


def parse(argv: Sequence[str]) -> argparse.Namespace | int:
    """The arguments of ``argv``, or the exit status when argparse has already answered
    (``--help``, ``--version``: 0; a usage error, said on stderr: 2)."""
    command = _command_named(argv)
    try:
        args = build_parser(command).parse_args(argv)
        if command is None:  # found by the whole parser only: read again with its arguments
            args = build_parser(args.command).parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    return args
