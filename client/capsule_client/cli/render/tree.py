"""How capsulectl shows processes: their command lines, descendants under their parents.

A process is shown by its command line (its argv, docs/design.md §5 "What
each process is"), shell-quoted as ``shlex.join`` writes it, so that
``sh -c 'sleep 500 &'`` reads as it was typed; where the daemon gave no argv
(``commands`` not asked, or the OS did not say) by what its receipt says.
Descendants are indented under their parent (``ps f`` style); one whose
parent has exited hangs from its root, marked ``[parent N exited]`` (``[parent
exited]`` when it was already re-parented to init when the daemon first saw it). Rows are
cut to the terminal's width with ``…`` (``--wide`` and ``--json``: whole).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import NamedTuple, Protocol, TextIO, TypeVar

from msgspec import UnsetType

from ...text import command_text, one_line

__all__ = [
    "Row",
    "cut",
    "indent",
    "nested",
    "shown",
    "terminal_width",
    "tree",
]


class Listed(Protocol):
    """What the tree needs of a process: ``SessionProcess`` or ``TerminatedProcess``."""

    @property
    def pid(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def parent_pid(self) -> int | UnsetType: ...
    @property
    def root_pid(self) -> int | UnsetType: ...
    @property
    def command(self) -> list[str] | UnsetType | None: ...


P = TypeVar("P", bound=Listed)


class Row(NamedTuple):
    """A process in display order."""

    depth: int
    process: Listed
    #: The parent it was started by, when that has exited (it hangs from its root).
    lost_parent: int | None = None


def tree(processes: Sequence[P]) -> list[Row]:
    """The processes in display order: each root (receipt or owned process) as listed,
    then its descendants depth first under their parents.

    A descendant whose parent is no longer listed hangs from its root (depth
    1, with ``lost_parent``); one whose root is no longer listed either comes
    last, at depth 0 with ``lost_parent`` (it hangs from nothing shown).
    """
    listed = {process.pid for process in processes}
    roots = [p for p in processes if p.kind != "descendant"]
    under: dict[int, list[tuple[Listed, int | None]]] = {}
    lost: list[tuple[Listed, int | None]] = []
    for process in processes:
        if process.kind != "descendant":
            continue
        parent = process.parent_pid if isinstance(process.parent_pid, int) else None
        root = process.root_pid if isinstance(process.root_pid, int) else None
        if parent is not None and parent in listed and parent != process.pid:
            under.setdefault(parent, []).append((process, None))
        else:
            if root is not None and root in listed:
                under.setdefault(root, []).append((process, parent if parent != root else None))
            else:
                lost.append((process, parent))
    order: list[Row] = []
    placed: set[int] = set()

    def place(process: Listed, depth: int, lost_parent: int | None) -> None:
        if process.pid in placed:  # a cycle of stale parents: listed once
            return
        placed.add(process.pid)
        order.append(Row(depth, process, lost_parent))
        for child, gone in under.get(process.pid, []):
            place(child, depth + 1, gone)

    for top in roots:
        place(top, 0, None)
    for orphan, gone in lost:
        place(orphan, 0, gone)
    order.extend(Row(1, p) for p in processes if p.pid not in placed)  # unreachable: a cycle
    return order


def nested(processes: Sequence[P]) -> list[tuple[int, P]]:
    """``(depth, process)`` in the display order of :func:`tree`."""
    return [(row.depth, row.process) for row in tree(processes)]  # type: ignore[misc]


def indent(depth: int) -> str:
    """The prefix of a process's command at ``depth`` (``ps f`` style)."""
    return "" if depth == 0 else "   " * (depth - 1) + " \\_ "


def shown(row: Row, fallback: str = "") -> str:
    """The command column of ``row``: indented, marked when its parent has exited, the
    process's command line made inert (``fallback``, what its receipt says, where the
    daemon gave none)."""
    if row.lost_parent is None:
        mark = ""
    elif row.lost_parent <= 1:  # re-parented before the daemon first saw it
        mark = "[parent exited] "
    else:
        mark = f"[parent {row.lost_parent} exited] "
    line = command_text(row.process.command)
    return indent(row.depth) + mark + (one_line(fallback) if line is None else line)


def cut(line: str, width: int | None) -> str:
    """``line`` within ``width`` characters, ending in ``…`` when cut (None: whole)."""
    if width is None or len(line) <= width:
        return line
    return line[: max(width - 1, 0)] + "…"


def terminal_width(out: TextIO) -> int | None:
    """The columns of the terminal ``out`` writes to (``$COLUMNS`` first), None when
    ``out`` is not a terminal: a pipe or a file gets whole lines, as from ``ps``."""
    try:
        if not out.isatty():
            return None
    except ValueError:  # closed
        return None
    return shutil.get_terminal_size().columns
