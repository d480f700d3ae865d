"""The hand-over point between the watcher and the reader (docs/design.md §5 ``pending``).

The watcher task (on the event loop) adds changed paths or asks for a rescan;
an observation (in a worker thread) drains what has accumulated. Both sides
may run at once, so every access takes a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ChangeFeed", "Changes"]


@dataclass(frozen=True, slots=True)
class Changes:
    """Changed paths (absolute), whether a full rescan is owed, whether the store was written."""

    paths: frozenset[Path] = field(default_factory=frozenset)
    rescan: bool = False
    store: bool = False

    def __bool__(self) -> bool:
        return self.rescan or self.store or bool(self.paths)


class ChangeFeed:
    """Thread-safe accumulator of file-system changes under the home.

    Paths are kept as a set, so a burst of writes to one receipt costs one
    re-read. ``generation`` counts every change added, so a caller can tell
    whether anything arrived between two points without draining.

    ``listener``, when set, is called after each addition (outside the lock,
    in the caller's thread): discovery uses it to observe at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: set[Path] = set()
        self._rescan = False
        self._store = False
        self._generation = 0
        self.listener: Callable[[], None] | None = None

    def add(self, paths: Iterable[Path]) -> None:
        """Record changed paths (absolute)."""
        with self._lock:
            before = len(self._paths)
            self._paths.update(paths)
            added = len(self._paths) != before
            if added:
                self._generation += 1
        if added:
            self._notify()

    def request_rescan(self) -> None:
        """Owe a full walk from scratch (a lost watch, an overflow, SIGHUP)."""
        with self._lock:
            self._rescan = True
            self._generation += 1
        self._notify()

    def store_changed(self) -> None:
        """The ownership store was written: answers must be observed again.

        No path becomes pending; the observation's ownership query tells
        whether anything changed (``PRAGMA data_version``, ``capsuled.reader.store``).
        """
        with self._lock:
            self._store = True
        self._notify()

    def drain(self) -> Changes:
        """Take everything recorded so far and leave the feed empty."""
        with self._lock:
            changes = Changes(frozenset(self._paths), self._rescan, self._store)
            self._paths = set()
            self._rescan = False
            self._store = False
            return changes

    def _notify(self) -> None:
        listener = self.listener
        if listener is not None:
            listener()

    @property
    def generation(self) -> int:
        """How many times something was added since the feed was made."""
        with self._lock:
            return self._generation

    def __bool__(self) -> bool:
        with self._lock:
            return self._rescan or self._store or bool(self._paths)
