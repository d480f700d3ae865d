"""Writing results to stdout: as the daemon sent them, and quietly after the reader left."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO

__all__ = ["print_json", "quiet_stdout"]


def print_json(out: TextIO, raw: bytes) -> None:
    """A result as the daemon sent it (``--json``): one JSON document and a newline."""
    out.write(raw.decode())
    out.write("\n")


def quiet_stdout(out: TextIO) -> None:
    """After EPIPE on stdout, point it at /dev/null so the exit flush stays quiet."""
    if out is sys.stdout:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
