"""``capsulectl integrate``'s account of each file for people: what it changed (or would
change, with the diff), or that it changed nothing (docs/design.md §12)."""

from __future__ import annotations

from ...agents.claude_code_settings import FileChange, diff

__all__ = ["render_change"]


def render_change(change: FileChange, *, remove: bool, dry_run: bool) -> str:
    """One file: ``PATH: what changed`` (``--dry-run``: ``would ...`` and the diff), or
    ``PATH: unchanged`` and why."""
    said = "; ".join(change.said)
    if not change.changed:
        why = said or (
            "none of capsuled's entries are in it"
            if remove
            else "capsuled's entries are there already, as they would be written"
        )
        return f"{change.path}: unchanged ({why})"
    if not dry_run:
        return f"{change.path}: {said}"
    return f"{change.path}: not written (--dry-run): {said}\n" + "".join(diff(change)).rstrip("\n")
