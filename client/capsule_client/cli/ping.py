"""``capsulectl ping``: is the daemon there, and which version."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..client import Client
from .exits import EXIT_OK
from .render.output import print_json

__all__ = ["run"]


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Ask ``ping``; print the version and the socket (``--json``: the result)."""
    if args.json:
        print_json(out, client.call_raw("ping"))
        return EXIT_OK
    result = client.ping()
    print(f"capsuled {result.version} is running on {client.socket_path}", file=out)
    return EXIT_OK
