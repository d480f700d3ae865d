"""``capsulectl terminate SESSION``: end a session's processes, show each outcome
(docs/design.md §7); ``--ended``: every ended session's leftovers (§13,
:mod:`.terminate_ended`)."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from .. import calls
from ..client import Client
from ..wire import TerminateSignal
from .exits import EXIT_OK, EXIT_USAGE
from .options import DEFAULT_GRACE_S, grace_s, wide_argument
from .render.terminate import render_terminate
from .render.tree import terminal_width
from .terminate_ended import ended_arguments, terminate_ended, usage_error

__all__ = ["arguments", "run"]

_SIGNALS: tuple[TerminateSignal, ...] = ("TERM", "INT", "HUP", "KILL")


def _signal(text: str) -> TerminateSignal:
    name = text.upper().removeprefix("SIG")
    for signal in _SIGNALS:
        if signal == name:
            return signal
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(_SIGNALS)}, not {text!r}")


def arguments(parser: argparse.ArgumentParser) -> None:
    """``SESSION | --ended [--older-than D] [--dry-run]``, ``[--signal S] [--wide] [--grace S]``."""
    parser.add_argument(
        "session_id", metavar="SESSION", nargs="?", help="an active session, ses_..."
    )
    ended_arguments(parser)
    parser.add_argument(
        "--signal",
        type=_signal,
        default="TERM",
        metavar="S",
        help="the first signal: TERM, INT, HUP or KILL (default: TERM)",
    )
    wide_argument(parser)
    parser.add_argument(
        "--grace",
        type=grace_s,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help=f"seconds the processes have to exit before SIGKILL (default: {DEFAULT_GRACE_S:g})",
    )


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask ``session.terminate`` with the command lines; print the report (``--json``: the
    result). Errors are raised to ``main``. ``--ended``: :mod:`.terminate_ended`."""
    error = usage_error(args)
    if error is not None:
        print(f"capsulectl terminate: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.ended:
        return terminate_ended(client, args, out)
    if args.json:
        call = calls.terminate(
            args.session_id, signal=args.signal, grace_s=args.grace, commands=True
        )
        raw = client.call_raw(call.method, call.params, min_timeout_s=call.min_timeout_s)
        out.write(raw.decode() + "\n")
        return EXIT_OK
    report = client.terminate(
        args.session_id, signal=args.signal, grace_s=args.grace, commands=True
    )
    print(render_terminate(report, width=terminal_width(out), wide=args.wide), file=out)
    return EXIT_OK
