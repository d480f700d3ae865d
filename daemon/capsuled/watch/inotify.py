"""The Linux native watch: the daemon's own inotify watch of the entered directories.

Through ``inotify_simple``; its descriptor is read on the event loop (no
thread, no polling step). The rules (docs/design.md §8 "The watch"):

* directories only (``IN_ONLYDIR``), never through a symlink
  (``IN_DONT_FOLLOW``, and an ``lstat`` before every add): a link is an
  entry, never a directory to watch;
* one path per watch descriptor: a directory reachable by a second path
  (the kernel hands back the same descriptor) keeps its first, real path;
* no ``IN_OPEN`` / ``IN_ACCESS`` / ``IN_CLOSE_NOWRITE``: another program
  reading the home costs nothing;
* its losses are reported: a queue overflow owes a walk at once and the
  watch is completed again; a directory that cannot be watched (the watch
  limit, any add failure) is polled instead and retried every poll interval;
* a cookie (a hidden file created in the home) is a barrier: once its event
  is read, every event queued before it has been fed (read-your-writes).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import anyio
import structlog
from inotify_simple import INotify, flags

from capsuled.common.shortage import is_shortage
from capsuled.home.layout import STORE_FILES, Parts, entered, reader_cares

from .changes import ChangeFeed, ChangesFound
from .cookies import Cookies
from .polling import Poller, open_directory

__all__ = ["InotifyWatch", "WatchLost", "WatchMap"]

log = structlog.get_logger("capsuled.watcher")

_MASK: Final = (
    flags.CREATE
    | flags.DELETE
    | flags.MODIFY
    | flags.CLOSE_WRITE
    | flags.ATTRIB
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.DELETE_SELF
    | flags.MOVE_SELF
    | flags.ONLYDIR
    | flags.DONT_FOLLOW
    | flags.EXCL_UNLINK
)
_ARRIVED: Final = flags.CREATE | flags.MOVED_TO
_LEFT: Final = flags.DELETE | flags.MOVED_FROM
_GONE: Final = flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF | flags.UNMOUNT
#: Add failures that mean "this path is not a directory to watch (any more)".
_NOT_A_DIRECTORY: Final = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


class WatchLost(Exception):
    """The home itself was removed, moved or unmounted: start a new watch (and walk)."""


class WatchMap:
    """Watch descriptor ↔ path, one path per descriptor, and the watched or polled
    directories indexed by parent (to forget a subtree at once)."""

    def __init__(self) -> None:
        self._paths: dict[int, Parts] = {}  # wd → the one path it stands for
        self._wds: dict[Parts, int] = {}
        self._children: dict[Parts, set[Parts]] = {}  # watched or polled, by parent

    def __len__(self) -> int:
        return len(self._wds)

    def __contains__(self, parts: Parts) -> bool:
        return parts in self._wds

    def path_of(self, wd: int) -> Parts | None:
        """The path ``wd`` stands for, None for a watch removed since (or unknown)."""
        return self._paths.get(wd)

    def bind(self, parts: Parts, wd: int) -> int | None:
        """``parts`` is watched by ``wd`` now; the descriptor it replaces, if any."""
        old = self._wds.get(parts)
        if old is not None and old != wd:  # the path's directory was replaced unseen
            self._paths.pop(old, None)
        else:
            old = None
        self._paths[wd] = parts
        self._wds[parts] = wd
        self.note(parts)
        return old

    def note(self, parts: Parts) -> None:
        """Index a watched or polled directory under its parent."""
        if parts:
            self._children.setdefault(parts[:-1], set()).add(parts)

    def known_below(self, parts: Parts) -> list[Parts]:
        """The watched and polled directories below ``parts`` (not itself), parents first."""
        found: list[Parts] = []
        pending = [parts]
        while pending:
            children = self._children.get(pending.pop(), ())
            found.extend(children)
            pending.extend(children)
        return found

    def forget_below(self, parts: Parts) -> list[tuple[Parts, int | None]]:
        """Forget ``parts`` and everything below it: each path with its descriptor (if watched)."""
        forgotten: list[tuple[Parts, int | None]] = []
        for known in [parts, *self.known_below(parts)]:
            self._children.pop(known, None)
            wd = self._wds.pop(known, None)
            if wd is not None:
                self._paths.pop(wd, None)
            forgotten.append((known, wd))
        if parts:
            siblings = self._children.get(parts[:-1])
            if siblings is not None:
                siblings.discard(parts)
        return forgotten


class InotifyWatch:
    """One inotify instance watching the entered directories of one home.

    Args:
        home: the home, absolute (as configured: paths are fed under it).
        feed: where changed paths, store writes and rescans go.
        poll_interval_s: how often directories that could not be watched are
            retried and, meanwhile, polled.

    Attributes:
        overflows: kernel queue overflows seen by this watch.
        add_failures: directories whose watch could not be added, in total.
    """

    backend: Final = "inotify"

    def __init__(self, home: str, feed: ChangeFeed, *, poll_interval_s: float) -> None:
        self._home = home
        self._feed = feed
        self._poll_interval_s = poll_interval_s
        self._inotify: INotify | None = None
        self._map = WatchMap()
        self._polled: set[Parts] = set()
        self._poller = Poller(home)
        self._cookies = Cookies(home, feed)
        self._walk_owed = False  # completing the watch after an overflow
        self.overflows = 0
        self.add_failures = 0

    @property
    def watched(self) -> int:
        """Directories watched now."""
        return len(self._map)

    @property
    def polled(self) -> int:
        """Directories that could not be watched and are polled now."""
        return len(self._polled)

    async def run(self, started: Callable[[], None]) -> None:
        """Watch until cancelled; ``started()`` once every entered directory is watched.

        Raises:
            OSError: no inotify instance could be had, or the home cannot be
                watched (the caller falls back to polling).
            WatchLost: the home was removed, moved or unmounted.
        """
        inotify = INotify(nonblocking=True)
        self._inotify = inotify
        try:
            # The first walk of the watch runs in a worker thread: a big home
            # takes a while. The descriptor is read only after it.
            await anyio.to_thread.run_sync(self._watch_home)
            started()
            await self._read_forever(inotify)
        finally:
            self._inotify = None
            self._cookies.release()
            anyio.notify_closing(inotify.fileno())
            inotify.close()

    async def sync(self) -> None:
        """Wait until every change made before this call has been fed.

        A cookie barrier for the watched directories, then a poll of the ones
        that could not be watched. Returns at once when the watch is not
        running: its restart owes a walk.
        """
        if self._inotify is None:
            return
        await self._cookies.barrier()
        if self._polled and self._inotify is not None:
            self._poll_unwatched()  # what the cookie cannot vouch for

    def recheck(self) -> None:
        """Add every watch again and forget what went: something changed unseen.

        After verification found changes the watch missed (a directory
        replaced without an event, a mount over it), so that later changes
        there are heard again.
        """
        if self._inotify is not None:
            self._add_below((), recheck=True)

    # ----------------------------------------------------------------------
    # Adding watches

    def _watch_home(self) -> None:
        """Watch the home and everything entered below it.

        Raises:
            OSError: the home cannot be watched.
            WatchLost: the home went away meanwhile.
        """
        if self._add(()) is None:
            raise WatchLost("the home went away as its watch started")
        self._add_below(())

    def _add(self, parts: Parts) -> int | None:
        """Add the watch of one directory; None if it is not one to watch.

        A directory that cannot be watched for another reason is polled (its
        entries remembered now, so later changes are found) and retried.

        Raises:
            OSError: only for the home, which must be watchable.
        """
        assert self._inotify is not None
        path = os.path.join(self._home, *parts)
        # The home itself may be configured as a link; nothing below it is followed.
        mask = _MASK if parts else _MASK & ~flags.DONT_FOLLOW
        try:
            before = os.lstat(path) if parts else os.stat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(before.st_mode):
            return None  # a link or a file: nothing to watch
        for _ in range(2):
            try:
                wd = int(self._inotify.add_watch(path, mask))
            except OSError as exc:
                if exc.errno in _NOT_A_DIRECTORY:
                    return None  # gone, or a link now
                if not parts:
                    raise  # the home cannot be watched: the caller polls instead
                self._poll_instead(parts, exc)
                return None
            known = self._map.path_of(wd)
            if known is None or known == parts:
                break
            if _leads_to(os.path.join(self._home, *known), before):
                # The same directory by a second path (a bind mount): the
                # first path stays the watch's only one.
                log.debug("directory already watched by another path", path=path, first=known)
                return None
            # Renamed unseen (its events were lost): its old path is not its
            # own any more. Forget it (and below), then watch it here afresh.
            self._forget_below(known)
        else:
            return None
        old = self._map.bind(parts, wd)
        if old is not None:  # the path's directory was replaced unseen
            self._remove_watch(old)
        if parts in self._polled:
            self._polled.discard(parts)
            self._poller.forget(parts)
        return wd

    def _add_below(self, parts: Parts, *, recheck: bool = False) -> None:
        """Add the watches of the entered directories below ``parts`` (its own is added).

        With ``recheck`` (after an overflow), every directory is added again,
        whether known or not, and what is known below ``parts`` but no longer
        there is forgotten: events about either may have been lost.
        """
        seen: set[Parts] = {parts}
        pending = [parts]
        short = False
        while pending:
            here = pending.pop()
            try:
                names = _entered_directories(self._home, here)
            except OSError as exc:  # short of descriptors: polled, listed again at a retry
                self._poll_instead(here, exc)
                short = True
                continue
            for name in names:
                child = (*here, name)
                known = child in self._map and not recheck
                if known or self._add(child) is not None or child in self._polled:
                    seen.add(child)
                    pending.append(child)
        if recheck and not short:  # what was not listed is not known to be gone
            for gone in [known for known in self._map.known_below(parts) if known not in seen]:
                self._forget_below(gone)

    def _poll_instead(self, parts: Parts, exc: OSError) -> None:
        if parts in self._polled:
            return  # a retry that failed again: polled as before
        self.add_failures += 1
        log.warning(
            "cannot watch a directory; polling it instead",
            path=os.path.join(self._home, *parts),
            cause=os.strerror(exc.errno) if exc.errno else str(exc),
            poll_interval_s=self._poll_interval_s,
        )
        self._polled.add(parts)
        self._map.note(parts)
        self._poller.look(parts, ChangesFound(), report=False)
        # What was created before the first look is the reader's to find.
        self._feed.add([self._absolute(parts)])

    def _forget_below(self, parts: Parts) -> None:
        """Drop the watches (and polls) of ``parts`` and everything below it."""
        for known, wd in self._map.forget_below(parts):
            if wd is not None:
                self._remove_watch(wd)
            if known in self._polled:
                self._polled.discard(known)
                self._poller.forget(known)

    def _remove_watch(self, wd: int) -> None:
        assert self._inotify is not None
        try:
            self._inotify.rm_watch(wd)
        except OSError:
            pass  # already gone with its directory

    # ----------------------------------------------------------------------
    # Reading events

    async def _read_forever(self, inotify: INotify) -> None:
        next_poll = time.monotonic() + self._poll_interval_s
        while True:
            if self._polled:
                with anyio.move_on_after(max(0.0, next_poll - time.monotonic())):
                    await anyio.wait_readable(inotify.fileno())
            else:
                await anyio.wait_readable(inotify.fileno())
            self._handle(inotify)
            if self._walk_owed:
                self._walk_owed = False
                self._add_below((), recheck=True)  # what came or went while events were lost
            if self._polled and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self._poll_interval_s
                self._poll_unwatched()
            elif not self._polled:
                next_poll = time.monotonic() + self._poll_interval_s

    def _handle(self, inotify: INotify) -> None:
        found = ChangesFound()
        for event in inotify.read(timeout=0):
            if event.mask & flags.Q_OVERFLOW:
                self._overflowed()
                continue
            parts = self._map.path_of(event.wd)
            if parts is None:
                continue  # a watch removed since, or a second path's
            if event.mask & _GONE:
                self._watch_gone(parts, event.mask)
            elif event.name:
                self._entry_changed((*parts, event.name), event.mask, found)
            elif not parts and event.mask & flags.ATTRIB:
                found.home = True  # its mode or owner: its strictness (docs/design.md §3)
            # A subdirectory's own chmod or chown says nothing its entries' events do not.
        self._flush(found)

    def _watch_gone(self, parts: Parts, mask: int) -> None:
        """The watched directory itself was removed, moved or unmounted."""
        if not parts:
            raise WatchLost("the home was removed, moved or unmounted")
        if mask & (flags.MOVE_SELF | flags.IGNORED):
            # Moved (the watch followed it elsewhere: its path is not its own)
            # or gone: its watch, and any below it, stand for nothing now.
            self._forget_below(parts)

    def _entry_changed(self, child: Parts, mask: int, found: ChangesFound) -> None:
        """One event about an entry of a watched directory, into ``found``."""
        name = child[-1]
        if name.startswith("."):
            if len(child) == 1 and self._cookies.ours(name):
                self._flush(found)  # everything before the cookie is fed first
                found.paths.clear()
                found.store = found.home = False
                self._cookies.arrived(name)
            return
        if child in STORE_FILES:
            found.store = True
            return
        if mask & flags.ISDIR:
            if mask & _LEFT:
                self._forget_below(child)
            elif mask & _ARRIVED and entered(child):
                if self._add(child) is not None or child in self._polled:
                    self._add_below(child)
            elif not mask & (_LEFT | _ARRIVED):
                # A directory's chmod or chown says nothing its entries' own
                # events do not; fed, it would make the reader walk for nothing.
                return
        if reader_cares(child):
            found.paths.add(child)

    def _flush(self, found: ChangesFound) -> None:
        found.feed(self._feed, self._home)

    def _overflowed(self) -> None:
        self.overflows += 1
        log.warning(
            "inotify queue overflowed: events were lost; walking the home",
            home=self._home,
            overflows=self.overflows,
        )
        self._feed.request_rescan()
        self._walk_owed = True
        self._cookies.release()  # the walk owed covers whatever they waited for

    def _poll_unwatched(self) -> None:
        """Retry each unwatched directory; poll the ones that still cannot be watched."""
        found = ChangesFound()
        for parts in sorted(self._polled):
            wd = self._add(parts)
            if wd is not None:
                log.info("directory watched again", path=os.path.join(self._home, *parts))
                self._feed.add([self._absolute(parts)])  # what came meanwhile
                self._add_below(parts)
            elif parts in self._polled:
                for child in self._poller.look(parts, found):
                    if child not in self._map and child not in self._polled:
                        if self._add(child) is not None or child in self._polled:
                            self._add_below(child)
        self._flush(found)

    def _absolute(self, parts: Parts) -> Path:
        return Path(self._home, *parts)


def _leads_to(path: str, st: os.stat_result) -> bool:
    """Whether ``path`` is (still) the directory ``st`` describes (``lstat``)."""
    try:
        here = os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino)


def _entered_directories(home: str, here: Parts) -> list[str]:
    """The names of the entered directories in ``here`` (links are not directories);
    none when ``here`` is gone, a link now, or unreadable (the reader says which).

    Raises:
        OSError: the daemon is short of descriptors or memory
            (:func:`capsuled.common.shortage.is_shortage`): nothing is known of ``here``.
    """
    try:
        fd = open_directory(os.path.join(home, *here), follow=not here)
    except OSError as exc:
        if is_shortage(exc):
            raise
        return []
    try:
        with os.scandir(fd) as entries:
            return [
                entry.name
                for entry in entries
                if not entry.name.startswith(".")
                and entry.is_dir(follow_symlinks=False)
                and entered((*here, entry.name))
            ]
    except OSError as exc:
        if is_shortage(exc):
            raise
        return []  # gone while listed
    finally:
        os.close(fd)
