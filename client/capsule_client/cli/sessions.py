"""``capsulectl sessions``: the active sessions, read-your-writes, as a table."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..client import Client
from .exits import EXIT_OK, EXIT_REMOTE_ERROR
from .options import wide_argument
from .render.output import print_json, say_unsettled
from .render.tables import render_sessions
from .render.tree import terminal_width

__all__ = ["arguments", "run"]


def arguments(parser: argparse.ArgumentParser) -> None:
    """``[--wide]``."""
    wide_argument(parser)


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask a fresh snapshot with the command lines; print it (``--json``: the result).

    An answer that is not ``ready`` is said on stderr, gaps first, with exit status 1:
    it lists no session, and a table would read "no active sessions".
    """
    # Read-your-writes: a runtime that just wrote a receipt sees it here.
    if args.json:
        params = {"max_age_ms": 0, "commands": True}
        print_json(out, client.call_raw("sessions.snapshot", params))
        return EXIT_OK
    snapshot = client.snapshot(fresh=True, commands=True)
    if say_unsettled(snapshot.discovery, snapshot.gaps):
        return EXIT_REMOTE_ERROR
    width = None if args.wide else terminal_width(out)
    print(render_sessions(snapshot, width=width, wide=args.wide), file=out)
    return EXIT_OK
