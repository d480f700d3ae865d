"""What ``capsulectl`` and the MCP server show of strings and times: text from files
made inert, ages and uptimes, command lines (docs/design.md §9, §11).

Commands, binaries, file names and ids come from receipts, traces and the
OS, which a model's output can reach; printed raw, an escape sequence would
act on the reader's terminal and a newline would break a table.

What it may import: the standard library, nothing of the package.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final

__all__ = [
    "argv_of",
    "command_line",
    "command_text",
    "counted",
    "duration",
    "inert",
    "one_line",
    "unsettled",
]

#: Characters a terminal would act on (C0, DEL, C1), Unicode line and
#: paragraph separators, and the bidi marks, embeddings, overrides and
#: isolates (U+200E-200F, U+202A-202E, U+2066-2069), which rearrange how the
#: rest of a line reads on screen.
_CONTROL: Final = (
    *range(0x00, 0x20),
    *range(0x7F, 0xA0),
    0x200E,
    0x200F,
    *range(0x2028, 0x202F),
    *range(0x2066, 0x206A),
)
_NAMED_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Each of them and how it is spelt: ``\n``, ``\r``, ``\t``, else ``\xNN`` or ``\uNNNN``.
_ESCAPES: Final = {
    code: _NAMED_ESCAPES.get(chr(code), f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")
    for code in _CONTROL
}


def inert(text: str) -> str:
    """``text`` with control characters (and bidi and line-separator ones) spelt as
    escapes, so it is one inert line.

    Commands, binaries and file names come from receipts and traces, which a
    model's output can reach; printed raw, an escape sequence would act on
    the reader's terminal and a newline would break the table.
    """
    return text.translate(_ESCAPES)


def one_line(text: str) -> str:
    """:func:`inert`, with backslashes doubled so that every escape is unambiguous."""
    return inert(text.replace("\\", "\\\\"))


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 process``, ``2 processes``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun}es" if noun.endswith(("s", "x", "ch", "sh")) else f"{n} {noun}s"


def duration(seconds: float) -> str:
    """An age or uptime for people, in whole units cut down as ``ps`` cuts them.

    Every unit is cut, none rounded, so 0.9 s is ``0s`` and 119.7 s is
    ``1m59s`` (never ``1m60s``), and of two ages the larger never reads less.
    """
    whole = int(max(seconds, 0.0))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def command_line(argv: object) -> str | None:
    """A process's argv as one command line, quoted as ``shlex.join`` writes it, so that
    ``sh -c 'sleep 500 &'`` reads as it was typed; None where there is none (the daemon
    said ``null``, or was not asked for ``commands``: not a list, or an empty one).

    The line is not made inert: :func:`inert` it before printing it.
    """
    if not isinstance(argv, list) or not argv:
        return None
    return shlex.join(argv)


def argv_of(cmdline: bytes) -> list[str]:
    """An argv from the NUL-separated bytes of ``/proc/<pid>/cmdline``, read as the daemon
    reads it (docs/design.md §5 "What each process is"): bytes that are not UTF-8 are
    written ``\\xNN`` (``backslashreplace``), as ``ps`` escapes what it cannot print."""
    return [part.decode("utf-8", "backslashreplace") for part in cmdline.split(b"\0")]


def command_text(argv: object) -> str | None:
    """A process's command line as people and models are shown it: :func:`command_line`
    made :func:`inert`, so ``\\xff`` (a byte that is not UTF-8, as the daemon spells it)
    reads ``\\xff`` wherever it is shown; None where there is none."""
    line = command_line(argv)
    return None if line is None else inert(line)


def unsettled(discovery: str, gaps: Sequence[str]) -> list[str]:
    """What to say first of an answer that is not ``ready``, in place of its sessions:
    ``discovery unavailable: WHY`` for each gap (a gap says what is wrong and, where
    the daemon knows one, the fix), inert; ``[]`` for a ``ready`` answer.

    An ``unavailable`` or ``scanning`` answer lists no session whatever runs: shown as
    a table it would read "no active sessions" (docs/design.md §9).
    """
    if discovery == "ready":
        return []
    state = inert(discovery)
    reasons = [inert(gap) for gap in gaps] or ["the daemon gave no reason"]
    lines = [f"discovery {state}: {reason}" for reason in reasons]
    if discovery == "scanning":
        lines.append(
            "discovery scanning: the answer did not settle within the request's deadline "
            "(the home kept changing); ask again"
        )
    return lines
