"""``capsulectl``: ask the daemon from a shell (docs/design.md §9). The entry point and
the dispatch; the command line is read by :mod:`.parser`.

Exit status: 0 success, 1 the daemon answered an error (or the reply was
lost or late), 2 bad usage, 3 the daemon is not running.

``--json`` prints the method's result exactly as it came over the wire, one
JSON document; without it, output is for people and may change.

Each command is a module of this package, named as the command, imported only
when the command runs (or its ``--help`` is asked): a command that connects
has ``run(client, args, out) -> int``, one that does not (``run``, ``mcp``)
``run(args, socket_path) -> int``, and either may have ``arguments(parser)``
for its own arguments. ``capsulectl --version`` alone is answered before the
parser is even imported: it needs nothing but the version; nor is
``capsulectl hook AGENT``, which an agent runs once per tool call (docs/design.md §12).
"""

from __future__ import annotations

import os
import sys

from ..wire.constants import VERSION
from .exits import EXIT_NOT_RUNNING, EXIT_OK, EXIT_REMOTE_ERROR, EXIT_USAGE

# Annotations only: ``capsulectl --version`` does not import ``typing`` (docs/design.md §9).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any, TextIO

    from ..errors import DaemonNotRunning

__all__ = ["main", "not_answering"]


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
    if argv == ["--version"]:  # as argparse prints it, without loading argparse
        print(f"capsulectl {VERSION}")
        return EXIT_OK
    if len(argv) == 2 and argv[0] == "hook" and not argv[1].startswith("-"):
        from .hook import run_hook  # once per tool call of an agent: no parser either

        return run_hook(argv[1])
    from .parser import COMMANDS, parse

    args = parse(argv)
    if isinstance(args, int):
        return args
    timeout_s = COMMANDS[args.command].timeout_s
    options: dict[str, Any] = {"socket": None, "json": False, "timeout": timeout_s}
    options.update({k: v for k, v in vars(args).items() if k in options})
    args.json, args.timeout = options["json"], options["timeout"]
    return _dispatch(args, options, out)


def _dispatch(args: argparse.Namespace, options: dict[str, Any], out: TextIO) -> int:
    """Run the command ``args`` names, connected first unless it connects itself."""
    from pathlib import Path

    from ..kit.paths import MAX_SOCKET_PATH_BYTES, default_socket
    from .parser import COMMANDS, command_module

    socket_path = default_socket() if options["socket"] is None else Path(options["socket"])
    too_long = len(os.fsencode(socket_path)) > MAX_SOCKET_PATH_BYTES
    if too_long and COMMANDS[args.command].checks_socket:
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
    from ..errors import CapsuleError, DaemonNotRunning, RemoteError, RequestTimeout
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
    except RequestTimeout as exc:
        print(f"capsulectl: {not_answering(exc)}", file=sys.stderr)
        return EXIT_REMOTE_ERROR
    except RemoteError as exc:
        print(f"capsulectl: the daemon answered error {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_REMOTE_ERROR
    except CapsuleError as exc:
        print(f"capsulectl: {exc}", file=sys.stderr)
        return EXIT_REMOTE_ERROR


def not_answering(exc: Exception) -> str:
    """What to say of a daemon that took the connection but did not answer in time."""
    return (
        f"capsuled is running but not answering: {exc}. It took the connection, so it is "
        "there, but stuck or very busy: its log says why (`journalctl --user -u capsuled`, "
        "or the terminal it runs in); a longer --timeout waits longer"
    )


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
