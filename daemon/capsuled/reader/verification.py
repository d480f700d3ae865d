"""Verification: what the walks last saw, compared with what is there now (docs/design.md §5).

A verification compares every listed directory's ``lstat`` signature with
its listing (listing again only one that differs) and every candidate's and
errored receipt's signature with the one taken when it was read, reading
again only what differs; it also re-checks the servers registry and notices
a receipt root that appeared since the last walk. A difference older than
the barrier it was given is a change the watch missed ("Trusting the watch,
and the net under it"). It costs a ``stat`` per listed directory and per
candidate: it grows with directories and candidates, never with stale
receipts.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from capsuled.home.layout import EXEC_PARTS, RUNS, Parts

from .listings import RACY_MARGIN_NS
from .walk import Walk

__all__ = ["Verification", "Verified"]


@dataclass(frozen=True, slots=True)
class Verified:
    """What a verification found (docs/design.md §5 "Verification").

    Attributes:
        checked: directories and candidates (and errored receipts) compared.
        missed: paths whose change the watch had not reported, sorted.
    """

    checked: int
    missed: list[str]


class Verification:
    """Verifies what one home's :class:`Walk` holds, through the walk's own reads.

    Args:
        walk: the walks of the home's receipt places.
    """

    def __init__(self, walk: Walk) -> None:
        self._walk = walk

    def verify(self, barrier_ns: int) -> Verified:
        """Compare listed directories and candidates with what was last seen; re-read what differs.

        Costs a ``stat`` per listed directory and per candidate (and errored
        receipt), plus a listing of each directory whose signature moved: it
        grows with directories and candidates, not with stale receipts.
        A difference older than ``barrier_ns`` (Unix ns) is one the watch missed.
        """
        walk = self._walk
        older = barrier_ns - RACY_MARGIN_NS
        missed: list[str] = []
        checked = self._listings(barrier_ns, missed)
        for path in walk.errors.directories():
            checked += 1
            if not os.path.lexists(path):  # a directory's error, the directory gone
                walk.errors.clear(path)
                if _older_than(path, older):
                    missed.append(path)
        receipts = walk.errors.receipts()
        for path in [*(walk.home.join(key) for key in walk.candidates), *receipts]:
            checked += 1
            before = walk.changes()
            stamps = self._stamps_read(path)
            walk.receipts.recheck(path)
            if walk.changes() != before and _changed_before(path, stamps, older):
                missed.append(path)
        walk.receipts.recheck_servers()
        return Verified(checked, sorted(set(missed)))

    def _listings(self, barrier_ns: int, missed: list[str]) -> int:
        """The roots and every listed directory compared; what differs read. Returns the count."""
        walk = self._walk
        checked = 0
        older = barrier_ns - RACY_MARGIN_NS
        for parts in ((RUNS,), EXEC_PARTS):  # a root that was missing at its last walk
            root = walk.home.join(*parts)
            checked += 1
            if root not in walk.listings and self._is_real_directory(parts):
                walk.rescan = True  # what a change to it asks, as an event would
                if _older_than(root, older):
                    missed.append(root)
        for directory in walk.listings.paths():
            walk.receipts.check_cancelled()
            checked += 1
            differing = walk.listings.differing(directory, barrier_ns, walk.matters)
            for path, racy in differing or ():
                if self._listed_as_is(path):
                    continue  # its own listing is compared in this loop (or was just taken)
                before = walk.changes()
                walk.apply(path)
                # A change during this run (its entry's own stamps are young)
                # is still on its way through the watch: not a miss.
                if walk.changes() != before and not racy and _older_than(path, older):
                    missed.append(path)
        return checked

    def _stamps_read(self, path: str) -> tuple[int, int] | None:
        """The (``mtime_ns``, ``ctime_ns``) of the version of a candidate or errored
        receipt that was read last, None if it has no signature."""
        walk = self._walk
        candidate = walk.candidates.get(walk.home.key(path))
        if candidate is not None:
            signature = candidate.signature
        else:
            error = walk.errors.get(path)
            signature = None if error is None else error.signature
        return None if signature is None else (signature.mtime_ns, signature.ctime_ns)

    def _listed_as_is(self, path: str) -> bool:
        """Whether ``path`` is a directory listed already, by the inode it has now.

        A directory the watch reported was listed then, but its parent's
        listing still lacks it: the parent differs at the next verification.
        Listing it again from there would find changes made after the
        barrier inside it, yet judge their age by the directory's own stamps
        (an in-place rewrite of a receipt leaves them old): a false miss. Its
        own listing and its candidates are compared in this run anyway.
        """
        listed = self._walk.listings.inode(path)
        if listed is None:
            return False
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_ino == listed

    def _is_real_directory(self, parts: Parts) -> bool:
        """Whether ``parts`` is a directory reached from the home through no symlink."""
        for depth in range(1, len(parts) + 1):
            try:
                st = os.lstat(self._walk.home.join(*parts[:depth]))
            except OSError:
                return False
            if not stat.S_ISDIR(st.st_mode):
                return False
        return True


def _changed_before(path: str, stamps: tuple[int, int] | None, moment_ns: int) -> bool:
    """Whether the change found at ``path`` (re-read by verification) is older than ``moment_ns``.

    ``stamps`` are the (``mtime_ns``, ``ctime_ns``) of the version read
    before. A file that still carries them changed without stamps of its
    own yet: a write in progress (a ``stat`` during ``open(O_TRUNC)`` sees
    the new size before the new times) or a second write in the same
    timestamp tick. Such a change cannot be dated, so it is not counted as
    missed: the watch reports it when it ends (docs/design.md §5).
    """
    try:
        st = os.lstat(path)
    except OSError:
        return _older_than(path, moment_ns)
    if stamps is not None and (st.st_mtime_ns, st.st_ctime_ns) == stamps:
        return False
    return max(st.st_mtime_ns, st.st_ctime_ns) < moment_ns


def _older_than(path: str, moment_ns: int) -> bool:
    """Whether the entry at ``path`` last changed before ``moment_ns`` (gone: yes)."""
    while True:
        try:
            st = os.lstat(path)
            break
        except OSError:  # gone: when the nearest directory still there last changed says when
            parent = os.path.dirname(path)
            if parent == path:
                return True
            path = parent
    return max(st.st_mtime_ns, st.st_ctime_ns) < moment_ns
