"""``capsulectl status``: the daemon's state, watcher, last observation and counters."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..client import Client
from .exits import EXIT_OK
from .render.output import print_json
from .render.tables import render_status

__all__ = ["run"]


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask ``status``; print it as aligned lines (``--json``: the result)."""
    if args.json:
        print_json(out, client.call_raw("status"))
        return EXIT_OK
    print(render_status(client.status()), file=out)
    return EXIT_OK
