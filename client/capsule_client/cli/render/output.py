"""Writing results to stdout: as the daemon sent them, quietly after the reader left, and
never an unsettled answer as an empty one."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from ...text import unsettled

__all__ = ["print_json", "quiet_stdout", "say_unsettled"]


def print_json(out: TextIO, raw: bytes) -> None:
    """A result as the daemon sent it (``--json``): one JSON document and a newline."""
    out.write(raw.decode())
    out.write("\n")


def quiet_stdout(out: TextIO) -> None:
    """After EPIPE on stdout, point it at /dev/null so the exit flush stays quiet."""
    if out is sys.stdout:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def say_unsettled(discovery: str, gaps: Sequence[str]) -> bool:
    """Say on stderr why an answer that is not ``ready`` lists no session (the gaps, with
    their fixes) and what to do; False, saying nothing, for a ``ready`` answer.

    ``sessions``, ``top`` and ``watch`` then exit 1 instead of showing an empty table
    (docs/design.md §9); ``--json`` prints the answer as it came.
    """
    lines = unsettled(discovery, gaps)
    if not lines:
        return False
    for line in lines:
        print(f"capsulectl: {line}", file=sys.stderr)
    print(
        "capsulectl: no answer about sessions until that is fixed; `capsulectl status` tells more",
        file=sys.stderr,
        flush=True,
    )
    return True
