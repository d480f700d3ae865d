"""What each walked directory held when the reader last listed it (docs/design.md §5).

Verification compares a directory's ``lstat`` signature (inode, ``mtime_ns``)
with the one taken when it was listed; only a directory that differs is
listed again, and only its entries that came or whose inode differs are
handed back to be read. So a verification run costs a ``stat`` per
directory, not a read per stale receipt.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["RACY_MARGIN_NS", "Listings"]

#: A change whose timestamp is this close to the barrier (or after it) may
#: still be on its way through the watch: it is read, but not counted as one
#: the watch missed. Covers the kernel's coarse file-time clock.
RACY_MARGIN_NS: Final = 50_000_000


@dataclass(slots=True)
class _Listing:
    signature: tuple[int, int]  # (inode, mtime_ns) of the directory when listed
    #: hash((name, inode)) of each entry that matters, sorted: 8 bytes an entry,
    #: so a directory of 100k stale receipts costs under a MiB.
    entries: array[int]


def _entries(names: dict[str, int]) -> array[int]:
    return array("q", sorted(hash(item) for item in names.items()))


class Listings:
    """The directory listings the reader's walks took, by absolute path."""

    def __init__(self) -> None:
        self._by_path: dict[str, _Listing] = {}

    def __len__(self) -> int:
        return len(self._by_path)

    def __contains__(self, path: object) -> bool:
        return path in self._by_path

    def record(self, path: str, st: os.stat_result, names: dict[str, int]) -> None:
        """Remember what a listing of ``path`` found; ``st`` was taken before it."""
        self._by_path[path] = _Listing((st.st_ino, st.st_mtime_ns), _entries(names))

    def clear(self) -> None:
        self._by_path.clear()

    def forget_under(self, path: str) -> None:
        """Forget ``path`` and every listing below it."""
        prefix = path + os.sep
        for known in [p for p in self._by_path if p == path or p.startswith(prefix)]:
            del self._by_path[known]

    def paths(self) -> list[str]:
        return list(self._by_path)

    def lost(self, path: str, inode: int) -> None:
        """The entry at ``path`` (with ``inode`` when it was read) was found gone.

        Its directory's listing forgets it and is listed again at its next
        comparison: if the entry comes back as it was (its directory moved away
        and back), the comparison hands it back to be read, though the listing's
        own stamps and a poller's last look may say nothing changed.
        """
        listing = self._by_path.get(os.path.dirname(path))
        if listing is None:
            return
        entry = hash((os.path.basename(path), inode))
        listing.entries = array("q", [known for known in listing.entries if known != entry])
        listing.signature = (listing.signature[0], -1)  # no directory has this mtime

    def inode(self, path: str) -> int | None:
        """The inode ``path`` had when it was listed; None if it is not listed."""
        listing = self._by_path.get(path)
        return None if listing is None else listing.signature[0]

    def differing(
        self, path: str, barrier_ns: int, matters: Callable[[str], bool]
    ) -> list[tuple[str, bool]] | None:
        """The entries of ``path`` that differ from its listing, each with whether it is racy.

        Returns:
            None when the directory's signature is unchanged (nothing listed);
            otherwise (absolute path, racy) for every entry that came or was
            replaced (one that went is found by the reader's check of what it
            keeps: candidates and errors), racy when its change may be younger than
            ``barrier_ns`` (Unix ns) less :data:`RACY_MARGIN_NS`. Only entries
            whose absolute path ``matters`` are compared and remembered. A
            directory that is gone is forgotten: its parent's listing reports it.
        """
        listing = self._by_path.get(path)
        if listing is None:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            self.forget_under(path)
            return []
        if (st.st_ino, st.st_mtime_ns) == listing.signature:
            return None
        young = st.st_mtime_ns >= barrier_ns - RACY_MARGIN_NS
        now: dict[str, int] = {}
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if not entry.name.startswith(".") and matters(entry.path):
                        now[entry.name] = entry.inode()
        except OSError:
            self.forget_under(path)
            return []
        listing.signature = (st.st_ino, st.st_mtime_ns)
        known = set(listing.entries)
        found = [
            (os.path.join(path, name), young)
            for name, inode in now.items()
            if hash((name, inode)) not in known
        ]
        listing.entries = _entries(now)
        return sorted(found)
