"""``capsulectl watch``: the active sessions' changes as they happen, until interrupted."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..client import Client
from .options import wide_argument
from .render.follow import follow_changes

__all__ = ["arguments", "run"]


def arguments(parser: argparse.ArgumentParser) -> None:
    """``[--wide]``."""
    wide_argument(parser)


def run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Subscribe and print every change (``--json``: one document per line)."""
    return follow_changes(client, out, json_lines=args.json, wide=args.wide)
