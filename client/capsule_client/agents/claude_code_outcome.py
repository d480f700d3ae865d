"""What one run of the Claude Code hook works with and did: where it writes and asks
(:class:`Places`) and its outcome (:class:`HookOutcome`), shared by the hook and a
resume's report (docs/design.md §12).

What it may import: the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HookOutcome", "Places"]


@dataclass(frozen=True, slots=True)
class Places:
    """Where the hook writes and asks.

    Attributes:
        home: the capsuled home (the store, the traces).
        socket_path: the daemon's socket (a resume's reconcile and look).
    """

    home: Path
    socket_path: Path


@dataclass(slots=True)
class HookOutcome:
    """What one hook run did.

    Attributes:
        output: what the hook prints on stdout for Claude Code (``SessionStart``'s
            ``additionalContext`` JSON), or None.
        did: what was recorded, in words (for ``CAPSULE_HOOK_LOG``).
        problems: each step that failed and why; the hook says them on one stderr line.
    """

    output: str | None = None
    did: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
