"""``capsulectl rescan``: make the next observation walk the home from scratch."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..client import Client
from .exits import EXIT_OK
from .render.output import print_json

__all__ = ["run"]


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask ``reader.rescan``; say so (``--json``: the result)."""
    if args.json:
        print_json(out, client.call_raw("reader.rescan"))
        return EXIT_OK
    client.rescan()
    print("rescan scheduled: the next observation walks the home from scratch", file=out)
    return EXIT_OK
