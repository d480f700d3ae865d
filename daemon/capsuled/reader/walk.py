"""Walking the receipt places: from scratch, one changed path, or a verification.

A walk lists ``runs`` and ``runtime/exec-processes`` and the directories
below them that :func:`~capsuled.home.layout.walked` names, never through a
symlink, and reads every receipt it finds (the original ``scan``). A changed
path the watcher reported is brought up to date alone (the original
``reconcile``); a changed run or input directory is listed again from
scratch. A verification compares every listed directory and every candidate
with what was last seen and reads again what differs (docs/design.md §5).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from capsuled.home.layout import EXEC_PARTS, RUNS, Action, Parts, action, receipt_kind, walked

from .errors import describe, raise_if_short
from .listings import RACY_MARGIN_NS, Listings
from .receipts import ReceiptReader

__all__ = ["Verified", "Walk"]


@dataclass(frozen=True, slots=True)
class Verified:
    """What a verification found (docs/design.md §5 "Verification").

    Attributes:
        checked: directories and candidates (and errored receipts) compared.
        missed: paths whose change the watch had not reported, sorted.
    """

    checked: int
    missed: list[str]


class Walk:
    """The walks of one home's receipt places, over a :class:`ReceiptReader`.

    Attributes:
        rescan: the cache is not complete: the next observation walks from scratch.
        listings: what each walked directory held when last listed.
    """

    def __init__(self, receipts: ReceiptReader) -> None:
        self.receipts = receipts
        self.home = receipts.home
        self.candidates = receipts.candidates
        self.errors = receipts.errors
        self.listings = Listings()
        self.rescan = True
        self._linked_dirs: dict[str, bool] = {}  # parent → symlink on the way, per observation

    def changes(self) -> int:
        """A count that moves whenever a candidate or an error changes."""
        return self.candidates.revision + self.errors.revision

    def from_scratch(self) -> None:
        """Forget everything and walk both receipt places and the servers registry."""
        self.receipts.cost.rescans += 1
        self.receipts.numbers.clear()
        self.candidates.clear()
        self.errors.clear_all()
        self.listings.clear()
        self._scan(self.home.join(RUNS), (RUNS,))
        if self.receipts.runtime_is_real():
            self._scan(self.home.join(*EXEC_PARTS), EXEC_PARTS)
        self.receipts.read_servers()
        self.rescan = False

    def apply_all(self, paths: set[str]) -> None:
        """Bring each changed path up to date, in order (parents before children)."""
        self._linked_dirs = {}
        for path in sorted(paths):
            self.apply(path)

    def apply(self, path: str) -> None:
        """Bring one changed path up to date (the original ``reconcile``)."""
        parts = self.home.parts(path)
        what = action(parts)
        if what is Action.SERVERS:
            self.receipts.read_servers()
        elif what is Action.RESCAN:
            self.rescan = True
        elif self._through_symlink(path):  # a walk would not have gone there either
            self.receipts.forget(path)
            self._drop_under(path)
        elif what in (Action.PROVIDER_CLIENT, Action.EXEC):
            kind = receipt_kind(parts) if parts is not None else None
            if kind is not None:
                self.receipts.read(path, kind)
        elif what is Action.WALK and parts is not None:
            self._relist(path, parts)

    def recheck_all(self) -> None:
        """``stat``-check every candidate and errored receipt and the registry (step 2)."""
        receipts = self.errors.receipts()
        candidates = [self.home.join(key) for key in self.candidates]
        for path in [*candidates, *receipts]:  # a path is in one of the two
            self.receipts.recheck(path)
        self.receipts.recheck_servers()

    def recheck_below(self, directories: set[str]) -> None:
        """``stat``-check the candidates and errors below ``directories`` (absolute).

        A polled directory's entries moved since its last look: the reader may
        hold an entry there that came and went between two looks, which no
        change reported (``capsuled.watch.polling``, "Moved directories").
        """
        if not directories:
            return
        below = tuple(directory + os.sep for directory in directories)
        candidates = [self.home.join(key) for key in self.candidates]
        for path in [*candidates, *self.errors.receipts()]:
            if path.startswith(below):
                self.receipts.recheck(path)
        for path in self.errors.directories():
            if path.startswith(below) and not os.path.lexists(path):
                self.errors.clear(path)

    def verify(self, barrier_ns: int) -> Verified:
        """Compare listed directories and candidates with what was last seen; re-read what differs.

        Costs a ``stat`` per listed directory and per candidate (and errored
        receipt), plus a listing of each directory whose signature moved: it
        grows with directories and candidates, not with stale receipts.
        A difference older than ``barrier_ns`` (Unix ns) is one the watch missed.
        """
        older = barrier_ns - RACY_MARGIN_NS
        missed: list[str] = []
        checked = self._verify_listings(barrier_ns, missed)
        for path in self.errors.directories():
            checked += 1
            if not os.path.lexists(path):  # a directory's error, the directory gone
                self.errors.clear(path)
                if _older_than(path, older):
                    missed.append(path)
        receipts = self.errors.receipts()
        for path in [*(self.home.join(key) for key in self.candidates), *receipts]:
            checked += 1
            before = self.changes()
            stamps = self._stamps_read(path)
            self.receipts.recheck(path)
            if self.changes() != before and _changed_before(path, stamps, older):
                missed.append(path)
        self.receipts.recheck_servers()
        return Verified(checked, sorted(set(missed)))

    def _verify_listings(self, barrier_ns: int, missed: list[str]) -> int:
        """The roots and every listed directory compared; what differs read. Returns the count."""
        checked = 0
        older = barrier_ns - RACY_MARGIN_NS
        for parts in ((RUNS,), EXEC_PARTS):  # a root that was missing at its last walk
            root = self.home.join(*parts)
            checked += 1
            if root not in self.listings and self._is_real_directory(parts):
                self.rescan = True  # what a change to it asks, as an event would
                if _older_than(root, older):
                    missed.append(root)
        for directory in self.listings.paths():
            self.receipts.check_cancelled()
            checked += 1
            differing = self.listings.differing(directory, barrier_ns, self._matters)
            for path, racy in differing or ():
                if self._listed_as_is(path):
                    continue  # its own listing is compared in this loop (or was just taken)
                before = self.changes()
                self.apply(path)
                # A change during this run (its entry's own stamps are young)
                # is still on its way through the watch: not a miss.
                if self.changes() != before and not racy and _older_than(path, older):
                    missed.append(path)
        return checked

    def _stamps_read(self, path: str) -> tuple[int, int] | None:
        """The (``mtime_ns``, ``ctime_ns``) of the version of a candidate or errored
        receipt that was read last, None if it has no signature."""
        candidate = self.candidates.get(self.home.key(path))
        if candidate is not None:
            signature = candidate.signature
        else:
            error = self.errors.get(path)
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
        listed = self.listings.inode(path)
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
                st = os.lstat(self.home.join(*parts[:depth]))
            except OSError:
                return False
            if not stat.S_ISDIR(st.st_mode):
                return False
        return True

    def _matters(self, path: str) -> bool:
        """Whether an entry at ``path`` is one a listing keeps (a receipt or a walked directory)."""
        return action(self.home.parts(path)) is not Action.IGNORE

    def _relist(self, path: str, parts: Parts) -> None:
        """List a walked directory from scratch.

        What it no longer holds (a directory renamed away and another put in
        its place) is dropped; what it holds again is kept as it was, so a
        listing that finds nothing new changes nothing (nor counts as a change).
        """
        self.listings.forget_under(path)  # listed again below, where still there
        prefix = path + os.sep
        key_prefix = self.home.key(prefix)
        keys = [key for key in self.candidates if key.startswith(key_prefix)]
        errors = [known for known in self.errors if known == path or known.startswith(prefix)]
        self.receipts.seen = set()
        try:
            self._scan(path, parts)
        finally:
            seen, self.receipts.seen = self.receipts.seen, None
        for key in keys:
            if self.home.join(key) not in seen:
                self.candidates.drop(key)
        for known in errors:
            if known not in seen:
                self.errors.clear(known)

    def _through_symlink(self, path: str) -> bool:
        """Whether a directory between the home and ``path`` is a symlink.

        A watcher may follow symlinks and report paths below them; the walk
        never does, so neither does a pending read.
        """
        parent = os.path.dirname(path)
        linked = self._linked_dirs.get(parent)
        if linked is None:
            linked = self._linked_dirs[parent] = os.path.realpath(parent) != parent
        return linked

    def _drop_under(self, path: str) -> None:
        self.listings.forget_under(path)
        key_prefix = self.home.key(path + os.sep) if path != self.home.text else ""
        self.candidates.drop_under(key_prefix)
        self.errors.clear_under(path)

    def _scan(self, path: str, parts: Parts) -> None:
        """List a directory of the receipt places, never through a link (the original ``scan``)."""
        self.receipts.check_cancelled()
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "a symbolic link", path)
            entries = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            self._drop_under(path)
            if parts in ((RUNS,), EXEC_PARTS) and os.path.islink(path):
                self.receipts.set_error(path, "is a symbolic link; not followed")
            return
        except OSError as exc:
            raise_if_short(exc)  # the daemon's trouble, not the directory's
            self.receipts.set_error(path, f"cannot list directory: {describe(exc)}")
            return
        self.receipts.cost.directories += 1
        self.errors.clear(path)
        names: dict[str, int] = {}
        with entries:
            try:
                for entry in entries:
                    child = (*parts, entry.name)
                    if action(child) is not Action.IGNORE:
                        names[entry.name] = entry.inode()
                    self._visit(entry, child)
            except OSError as exc:
                raise_if_short(exc)
                self.receipts.set_error(path, f"cannot list directory: {describe(exc)}")
                return
        self.listings.record(path, st, names)

    def _visit(self, entry: os.DirEntry[str], parts: Parts) -> None:
        if entry.name.startswith("."):
            return
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        kind = receipt_kind(parts)
        if is_dir and kind is None:
            if walked(parts):
                self._scan(entry.path, parts)
            return
        # A receipt's place holds whatever it holds: a directory named x.json
        # is an error for that path, as it is when the watcher reports it.
        if kind is not None:
            self.receipts.read(entry.path, kind)


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
