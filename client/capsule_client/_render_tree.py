"""How capsulectl orders processes: descendants under their roots (docs/design.md §5)."""

from __future__ import annotations

from collections.abc import Sequence

from .protocol import SessionProcess

__all__ = ["indent", "nested"]


def nested(processes: Sequence[SessionProcess]) -> list[tuple[int, SessionProcess]]:
    """``(depth, process)`` in display order: each root (receipt or owned process) as
    listed, then its descendants depth first under their parents.

    A descendant whose parent is no longer listed hangs from its root (depth 1);
    one whose root is no longer listed either comes last, at depth 1.
    """
    listed = {process.pid for process in processes}
    roots = [p for p in processes if p.kind != "descendant"]
    under: dict[int, list[SessionProcess]] = {}
    lost: list[SessionProcess] = []
    for process in processes:
        if process.kind != "descendant":
            continue
        parent = process.parent_pid if isinstance(process.parent_pid, int) else None
        root = process.root_pid if isinstance(process.root_pid, int) else None
        if parent is not None and parent in listed and parent != process.pid:
            under.setdefault(parent, []).append(process)
        elif root is not None and root in listed:
            under.setdefault(root, []).append(process)
        else:
            lost.append(process)
    order: list[tuple[int, SessionProcess]] = []
    placed: set[int] = set()

    def place(process: SessionProcess, depth: int) -> None:
        if process.pid in placed:  # a cycle of stale parents: listed once
            return
        placed.add(process.pid)
        order.append((depth, process))
        for child in under.get(process.pid, []):
            place(child, depth + 1)

    for top in roots:
        place(top, 0)
    for process in lost:
        place(process, 1)
    order.extend((1, p) for p in processes if p.pid not in placed)  # unreachable: a cycle
    return order


def indent(depth: int) -> str:
    """The prefix of a process's command at ``depth`` (``ps f`` style)."""
    return "" if depth == 0 else "   " * (depth - 1) + " \\_ "
