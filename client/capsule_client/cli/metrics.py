"""``capsulectl metrics``: the daemon's metrics in the OpenMetrics text format, as they came."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..client import Client
from .exits import EXIT_OK
from .render.output import print_json

__all__ = ["run"]


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask ``metrics``; print its text (``--json``: the result)."""
    if args.json:
        print_json(out, client.call_raw("metrics"))
        return EXIT_OK
    out.write(client.metrics().text)
    return EXIT_OK
