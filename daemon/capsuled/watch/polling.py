"""The daemon's own ``lstat`` poller: what changed in the entered directories since the last look.

Used for the whole home by ``--watch polling``, and by the native watch for
the directories it could not watch (docs/design.md §8 "The watch"). It never
follows a symlink: entries are ``lstat``-ed (``os.scandir`` with
``follow_symlinks=False``), and a link is an entry like a file, never a
directory to enter. Everything here blocks; run it in a worker thread.
"""

from __future__ import annotations

import os
import stat
import time
from typing import TypeAlias

from capsuled.common.shortage import is_shortage
from capsuled.home.layout import (
    RACY_WINDOW_NS,
    STORE_FILES,
    Parts,
    entered,
    reader_cares,
    walked,
)

from .changes import ChangesFound

__all__ = ["HomeMissing", "Poller", "open_directory"]

#: What one entry looked like: (inode, type and mode, size, mtime_ns, ctime_ns);
#: for a directory only its inode and type (what changes below it is its own look).
_EntrySignature: TypeAlias = tuple[int, int, int, int, int]


def open_directory(path: str, *, follow: bool = False) -> int:
    """A descriptor of the directory at ``path``, never through a final symlink.

    Listing through it (``os.scandir(fd)``) cannot wander into a link's target
    if the directory was replaced by one after it was checked; ``follow`` is
    for the home itself, which may be configured as a link.

    Raises:
        OSError: not a directory (``ENOTDIR``, ``ELOOP`` for a link), gone, unreadable.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    return os.open(path, flags)


class HomeMissing(Exception):
    """The home is gone or is no longer the directory the poller started on."""


class Poller:
    """Remembers each looked-at directory's entries and reports what differs next time.

    **Moved directories.** The reader reads what a look reported later than
    the look, and lists a reported directory itself: it may see an entry
    that came after the look and went before the next one, which no two
    looks tell apart. Such an entry moves its directory's ``mtime``, so a
    walked directory whose ``mtime`` moved since its last look (or had changed
    within the racy window before that look) is reported in ``ChangesFound.moved``: the
    reader checks again what it holds below it (docs/watcher.md).

    Args:
        home: the home, absolute.
    """

    def __init__(self, home: str) -> None:
        self._home = home
        self._seen: dict[Parts, dict[str, _EntrySignature]] = {}
        self._home_identity: tuple[int, int] | None = None
        # Per directory, the files that changed less than the racy window before its last look.
        self._racy: dict[Parts, set[str]] = {}
        self._home_owner: tuple[int, int] | None = None  # (mode, uid): its strictness
        # Per walked directory, its ``mtime_ns`` at its last look; the ones changed
        # less than the racy window before it.
        self._stamps: dict[Parts, int] = {}
        self._racy_stamps: set[Parts] = set()

    @property
    def directories(self) -> int:
        """Directories looked at now."""
        return len(self._seen)

    def walk(self) -> ChangesFound:
        """Look at every entered directory from the home down.

        The first walk only remembers (it reports nothing). A directory that
        appeared is looked at in the same walk; one that went away is forgotten.

        The home's own mode and owner are compared too (``ChangesFound.home``): its
        strictness is checked by each observation (docs/design.md §3).

        Raises:
            HomeMissing: the home is missing or was replaced since the first walk.
        """
        try:
            st = os.stat(self._home)  # the home itself may be configured as a link
        except OSError as exc:
            raise HomeMissing(str(exc)) from exc
        identity = (st.st_dev, st.st_ino)
        if not stat.S_ISDIR(st.st_mode) or (
            self._home_identity is not None and identity != self._home_identity
        ):
            raise HomeMissing("the home was replaced")
        first = self._home_identity is None
        self._home_identity = identity
        found = ChangesFound()
        owner = (st.st_mode, st.st_uid)
        found.home = not first and owner != self._home_owner
        self._home_owner = owner
        present: set[Parts] = set()
        pending: list[Parts] = [()]
        while pending:
            parts = pending.pop()
            present.add(parts)
            children = self.look(parts, found, report=not first)
            pending.extend(children)
        for gone in [parts for parts in self._seen if parts not in present]:
            self.forget(gone)
        return found

    def look(self, parts: Parts, found: ChangesFound, *, report: bool = True) -> list[Parts]:
        """Look at one directory: add what differs from last time to ``found``.

        A directory never looked at before reports every entry (unless
        ``report`` is false: then it only remembers them). A file that changed
        less than :data:`RACY_WINDOW_NS` before the look is reported once more
        at the next one: a second write in the same timestamp tick would look
        the same.

        Returns:
            the entered subdirectories (real directories, never links).
        """
        before = self._seen.get(parts)
        racy_after = time.time_ns() - RACY_WINDOW_NS
        try:
            now, children, stamp = _list(os.path.join(self._home, *parts), parts)
        except OSError:  # the daemon is short of descriptors: nothing is known to have changed
            return _children(parts, before)
        # Files (a directory's signature has no stamps) changed within the racy window.
        young = {name for name, sig in now.items() if max(sig[3], sig[4]) >= racy_after}
        self._seen[parts] = now
        self._compare(parts, before or {}, now, young, found if report else None)
        if self._stamp(parts, stamp, racy_after) and report and before is not None:
            found.moved.add(parts)
        return children

    def _stamp(self, parts: Parts, stamp: int | None, racy_after: int) -> bool:
        """Remember a walked directory's ``mtime_ns`` (None: gone); whether it moved
        since its last look, or changed within the racy window before that look."""
        if not walked(parts):
            return False
        racy_before = parts in self._racy_stamps
        self._racy_stamps.discard(parts)
        old = self._stamps.pop(parts, None)
        if stamp is None:
            return False
        self._stamps[parts] = stamp
        changed = stamp != old
        if changed and stamp >= racy_after:  # racy until a later look confirms it, as a file
            self._racy_stamps.add(parts)
        return old is not None and (changed or racy_before)

    def _compare(
        self,
        parts: Parts,
        old: dict[str, _EntrySignature],
        now: dict[str, _EntrySignature],
        young: set[str],
        found: ChangesFound | None,
    ) -> None:
        """Report into ``found`` (None: report nothing) what differs, and the files that were
        racy at the previous look; remember the ones racy now."""
        racy_before = self._racy.pop(parts, set())
        # Racy until a later look confirms it: a young file that changed (or is new) now.
        racy = {name for name in young if now[name] != old.get(name)}
        if racy:
            self._racy[parts] = racy
        if found is not None:
            for name in now.keys() | old.keys():
                if now.get(name) != old.get(name) or name in racy_before:
                    _report(found, (*parts, name))

    def forget(self, parts: Parts) -> None:
        """Stop remembering the directory at ``parts`` (it is watched now, or gone)."""
        self._seen.pop(parts, None)
        self._racy.pop(parts, None)
        self._stamps.pop(parts, None)
        self._racy_stamps.discard(parts)


def _list(path: str, parts: Parts) -> tuple[dict[str, _EntrySignature], list[Parts], int | None]:
    """The entries of the directory at ``path``, its entered subdirectories and its
    ``mtime_ns``; none (and None) when it is gone, a link or unreadable (the reader
    says why).

    Raises:
        OSError: the daemon is short of descriptors or memory
            (:func:`capsuled.common.shortage.is_shortage`).
    """
    now: dict[str, _EntrySignature] = {}
    children: list[Parts] = []
    try:
        fd = open_directory(path, follow=not parts)
    except OSError as exc:
        if is_shortage(exc):
            raise
        return now, children, None
    try:
        # Taken before the listing: a change made during it moves it.
        stamp: int | None = os.fstat(fd).st_mtime_ns
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing
                child = (*parts, entry.name)
                if stat.S_ISDIR(st.st_mode):  # its chmod says nothing: its entries do
                    now[entry.name] = (st.st_ino, stat.S_IFDIR, 0, 0, 0)
                    if entered(child):
                        children.append(child)
                else:
                    now[entry.name] = (
                        st.st_ino,
                        st.st_mode,
                        st.st_size,
                        st.st_mtime_ns,
                        st.st_ctime_ns,
                    )
    except OSError as exc:
        if is_shortage(exc):  # cut short: what was listed is not all there is
            raise
        # else gone while listed
    finally:
        os.close(fd)
    return now, children, stamp


def _children(parts: Parts, before: dict[str, _EntrySignature] | None) -> list[Parts]:
    """The entered subdirectories ``parts`` held when last looked at."""
    return [
        (*parts, name)
        for name, signature in (before or {}).items()
        if signature[1] == stat.S_IFDIR and entered((*parts, name))
    ]


def _report(found: ChangesFound, parts: Parts) -> None:
    if parts in STORE_FILES:
        found.store = True
    elif reader_cares(parts):
        found.paths.add(parts)
