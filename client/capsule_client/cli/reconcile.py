"""``capsulectl reconcile FROM --as THIS --context CTX``: report (once) the background
commands a prior session left unaccounted (docs/design.md §6)."""

from __future__ import annotations

import argparse
from typing import TextIO

from .. import calls
from ..client import Client
from .exits import EXIT_OK
from .render.output import print_json
from .render.reconcile import render_reconcile

__all__ = ["arguments", "run"]


def arguments(parser: argparse.ArgumentParser) -> None:
    """``FROM --as THIS --context CTX``."""
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


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask ``session.reconcile``; print the report (``--json``: the result)."""
    call = calls.reconcile(args.from_session, args.this_session, args.context_id)
    if args.json:
        print_json(out, client.call_raw(call.method, call.params, min_timeout_s=call.min_timeout_s))
        return EXIT_OK
    report = client.reconcile(args.from_session, args.this_session, args.context_id)
    print(render_reconcile(args.from_session, report), file=out)
    return EXIT_OK
