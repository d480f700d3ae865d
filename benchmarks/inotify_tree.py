"""A bare inotify watch of a whole home: the baseline where watchman is not available.

:class:`InotifyTree` adds one watch per directory under a home (one
``inotify_simple`` instance) and does nothing else. In the benchmark's
process it gives the bare round trip of a change: create a file, read its
event (:meth:`InotifyTree.round_trip`). As ``python -m benchmarks.inotify_tree
HOME`` it watches the home and blocks reading events until killed: what an
idle watcher costs when it is nothing but an inotify descriptor.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

from inotify_simple import INotify, flags

__all__ = ["InotifyTree", "main"]

_MASK = (
    flags.CREATE
    | flags.DELETE
    | flags.MODIFY
    | flags.CLOSE_WRITE
    | flags.ATTRIB
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.ONLYDIR
    | flags.DONT_FOLLOW
)
_COOKIE = ".bench-cookie-"


class InotifyTree:
    """One inotify instance watching every directory under ``home``.

    Args:
        home: the directory to watch, recursively (as it is now).
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self.inotify = INotify()
        self.directories = 0
        self._numbers = itertools.count(1)
        for directory, _, _ in os.walk(home):
            self.inotify.add_watch(directory, _MASK)
            self.directories += 1

    def round_trip(self, timeout_s: float = 5.0) -> tuple[float, set[str]]:
        """Create a cookie in the home; seconds until its event is read, and the names seen.

        Every event queued before the cookie's is read with it (the names of
        the files they are about are returned), as a watcher's barrier does.

        Raises:
            TimeoutError: the cookie's event did not come within ``timeout_s``.
        """
        name = f"{_COOKIE}{os.getpid()}-{next(self._numbers)}"
        path = self.home / name
        seen: set[str] = set()
        started = time.perf_counter()
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        try:
            while True:
                remaining_ms = int((started + timeout_s - time.perf_counter()) * 1000)
                if remaining_ms <= 0:
                    raise TimeoutError(f"no event for {name} within {timeout_s} s")
                events = self.inotify.read(timeout=remaining_ms)
                seen.update(event.name for event in events)
                if name in seen:
                    elapsed_s = time.perf_counter() - started
                    seen.discard(name)
                    return elapsed_s, seen
        finally:
            path.unlink()
            self.inotify.read(timeout=0)  # the cookie's own deletion

    def close(self) -> None:
        """Close the descriptor (every watch with it)."""
        self.inotify.close()


def main(argv: list[str] | None = None) -> int:
    """Watch ``argv[0]`` and read (and drop) its events until killed."""
    args = sys.argv[1:] if argv is None else argv
    tree = InotifyTree(Path(args[0]))
    print(tree.directories, flush=True)  # ready
    while True:
        tree.inotify.read()


if __name__ == "__main__":
    raise SystemExit(main())
