"""``capsulectl top``: a live table of the sessions' processes with CPU and memory."""

from __future__ import annotations

import argparse
from typing import Final, TextIO

from ..client import Client
from ..wire.constants import MAX_PARAM_MS
from .options import positive_seconds, wide_argument
from .render.follow import follow_top

__all__ = ["arguments", "run"]

#: The longest ``--interval``: the daemon's longest long poll (``timeout_ms``).
INTERVAL_MAX_S: Final = MAX_PARAM_MS / 1000


def _interval_s(text: str) -> float:
    """``--interval``: positive seconds, at most an hour."""
    return positive_seconds(text, INTERVAL_MAX_S)


def arguments(parser: argparse.ArgumentParser) -> None:
    """``[--wide] [--interval S] [--once]``."""
    wide_argument(parser)
    parser.add_argument(
        "--interval",
        metavar="S",
        type=_interval_s,
        default=2.0,
        help=f"seconds between two refreshes, at most {INTERVAL_MAX_S:g}; a change of the "
        "answer refreshes at once (default: 2)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one table (CPU measured over --interval, at most 1 s) and exit",
    )


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Print the table, again on every change or interval, until interrupted (or once)."""
    return follow_top(
        client, out, interval_s=args.interval, once=args.once, json=args.json, wide=args.wide
    )
