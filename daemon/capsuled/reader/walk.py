"""Walking the receipt places: from scratch, or one changed path (docs/design.md §5 step 1).

A walk lists ``runs`` and ``runtime/exec-processes`` and the directories
below them that :func:`~capsuled.home.layout.walked` names, never through a
symlink, and reads every receipt it finds. A changed path the watcher
reported is brought up to date alone; a changed run or input directory is
listed again from scratch. What a walk saw is what a verification compares
(:mod:`capsuled.reader.verification`).
"""

from __future__ import annotations

import errno
import os
import stat
import time

from capsuled.home.layout import EXEC_PARTS, RUNS, Action, Parts, action, receipt_kind, walked

from .errors import describe, raise_if_short
from .listings import Listings
from .receipts import SYMLINK_NOT_FOLLOWED, ReceiptReader

__all__ = ["Walk"]


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
        """Bring one changed path up to date."""
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
                held = self._held_inode(path)
                self.receipts.read(path, kind)
                self._note_if_lost(path, held)
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
        """``stat``-check the candidates and errors below ``directories`` (absolute), and
        compare the listings at and below them.

        A polled directory's entries moved since its last look: the reader may
        hold an entry there that came and went between two looks, which no
        change reported (``capsuled.watch.polling``, "Moved directories"); and
        an entry the reader found gone (its directory moved away) may be back
        as it was, which a look that saw it before cannot tell apart: the
        listings that differ, or lost an entry, hand back what to read.
        """
        if not directories:
            return
        below = tuple(directory + os.sep for directory in directories)
        candidates = [self.home.join(key) for key in self.candidates]
        for path in [*candidates, *self.errors.receipts()]:
            if path.startswith(below):
                held = self._held_inode(path)
                self.receipts.recheck(path)
                self._note_if_lost(path, held)
        for path in self.errors.directories():
            if path.startswith(below) and not os.path.lexists(path):
                self.errors.clear(path)
        listed = [p for p in self.listings.paths() if p in directories or p.startswith(below)]
        now_ns = time.time_ns()
        for directory in sorted(listed):
            for path, _ in self.listings.differing(directory, now_ns, self.matters) or ():
                self.apply(path)

    def _held_inode(self, path: str) -> int | None:
        """The inode of the version of the receipt at ``path`` the reader holds, if any."""
        candidate = self.candidates.get(self.home.key(path))
        signature = candidate.signature if candidate is not None else None
        if signature is None and (error := self.errors.get(path)) is not None:
            signature = error.signature
        return None if signature is None else signature.ino

    def _note_if_lost(self, path: str, held: int | None) -> None:
        """A receipt the reader held and found gone: its directory's listing forgets it."""
        if held is not None and not os.path.lexists(path):
            self.listings.lost(path, held)

    def matters(self, path: str) -> bool:
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
        """List a directory of the receipt places, never through a link."""
        self.receipts.check_cancelled()
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "a symbolic link", path)
            entries = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            self._drop_under(path)
            if parts in ((RUNS,), EXEC_PARTS) and os.path.islink(path):
                self.receipts.set_error(path, SYMLINK_NOT_FOLLOWED)
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
