"""Text from files made safe for a terminal: control characters as escapes (docs/design.md §9).

Commands, binaries, file names and ids come from receipts, traces and the
OS, which a model's output can reach; printed raw, an escape sequence would
act on the reader's terminal and a newline would break a table.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["inert", "one_line"]

#: Characters a terminal would act on (C0, DEL, C1), Unicode line and
#: paragraph separators, and the bidi marks, embeddings, overrides and
#: isolates (U+200E-200F, U+202A-202E, U+2066-2069), which rearrange how the
#: rest of a line reads on screen.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return _NAMED_ESCAPES.get(match[0], f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def inert(text: str) -> str:
    """``text`` with control characters (and bidi and line-separator ones) spelt as
    escapes, so it is one inert line.

    Commands, binaries and file names come from receipts and traces, which a
    model's output can reach; printed raw, an escape sequence would act on
    the reader's terminal and a newline would break the table.
    """
    return _CONTROL.sub(_escape, text)


def one_line(text: str) -> str:
    """:func:`inert`, with backslashes doubled so that every escape is unambiguous."""
    return inert(text.replace("\\", "\\\\"))
