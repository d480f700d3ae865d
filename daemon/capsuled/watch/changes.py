"""The hand-over point between the watcher and the reader (docs/design.md §5 ``pending``).

The watcher task (on the event loop) adds changed paths or asks for a rescan;
an observation (in a worker thread) drains what has accumulated. Both sides
may run at once, so every access takes a lock. A watch gathers what one
look or one read of events found (:class:`ChangesFound`) and feeds it in one go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from capsuled.home.layout import Parts

__all__ = ["ChangeFeed", "Changes", "ChangesFound"]


@dataclass(frozen=True, slots=True)
class Changes:
    """Changed paths (absolute), whether a full rescan is owed, whether the store was
    written, whether the home's own mode or owner changed, and the polled directories
    whose entries moved (absolute)."""

    paths: frozenset[Path] = field(default_factory=frozenset)
    rescan: bool = False
    store: bool = False
    home: bool = False
    moved: frozenset[Path] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return self.rescan or self.store or self.home or bool(self.paths) or bool(self.moved)


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
        self._home = False
        self._moved: set[Path] = set()
        self._generation = 0
        self.listener: Callable[[], None] | None = None

    def add(self, paths: Iterable[Path]) -> None:
        """Record changed paths (absolute)."""
        self._record(self._paths, paths)

    def add_moved(self, directories: Iterable[Path]) -> None:
        """Record polled directories (absolute) whose entries moved since their last look:
        what the reader holds below them is checked again (``capsuled.watch.polling``)."""
        self._record(self._moved, directories)

    def _record(self, into: set[Path], items: Iterable[Path]) -> None:
        with self._lock:
            before = len(into)
            into.update(items)
            added = len(into) != before
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

    def home_changed(self) -> None:
        """The home's own mode or owner changed: answers must be observed again.

        No path becomes pending (a walk is not owed): each observation checks
        the home's strictness itself (docs/design.md §3).
        """
        with self._lock:
            self._home = True
        self._notify()

    @property
    def store_alone(self) -> bool:
        """Whether the store's flag is all that is recorded."""
        with self._lock:
            return self._store_alone()

    def take_store_alone(self) -> bool:
        """Take the store's flag if it is all that is recorded; whether it was."""
        with self._lock:
            alone = self._store_alone()
            if alone:
                self._store = False
            return alone

    def _store_alone(self) -> bool:
        return self._store and not (self._rescan or self._home or self._paths or self._moved)

    def drain(self) -> Changes:
        """Take everything recorded so far and leave the feed empty."""
        with self._lock:
            changes = Changes(
                frozenset(self._paths),
                self._rescan,
                self._store,
                self._home,
                frozenset(self._moved),
            )
            self._paths.clear()  # in place: a recording may hold the set already
            self._moved.clear()
            self._rescan = False
            self._store = False
            self._home = False
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
            return (
                self._rescan or self._store or self._home or bool(self._paths) or bool(self._moved)
            )


@dataclass(slots=True)
class ChangesFound:
    """What a poller's look or a read of watch events found, fed in one go: changed paths
    the reader cares about, the walked directories whose entries moved since their last
    look, whether the store was written, whether the home's own mode or owner changed."""

    paths: set[Parts] = field(default_factory=set)
    moved: set[Parts] = field(default_factory=set)
    store: bool = False
    home: bool = False

    def __bool__(self) -> bool:
        return self.store or self.home or bool(self.paths) or bool(self.moved)

    def feed(self, feed: ChangeFeed, home: str) -> None:
        """Hand what was found to ``feed``, as absolute paths below ``home``."""
        if self.paths:
            feed.add(Path(home, *parts) for parts in self.paths)
        if self.moved:
            feed.add_moved(Path(home, *parts) for parts in self.moved)
        if self.store:
            feed.store_changed()
        if self.home:
            feed.home_changed()
