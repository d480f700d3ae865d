"""Whether a writer is inside a write transaction of the ownership store (docs/design.md §5).

A commit to a WAL database is heard before it can be read: the writer
``write``s its frames to ``capsule.db-wal`` (the watch's event), syncs them,
and only then publishes the commit in the shared-memory index
``capsule.db-shm`` — a store of memory, which makes no event — and leaves
its transaction. An observation woken by the event may so read the version
(``PRAGMA data_version``) before the commit, and nothing would wake another.

The writer holds SQLite's WAL write lock from the start of its write
transaction until the commit is published: an exclusive POSIX record lock
on byte 120 of the ``-shm`` file (the documented WAL-index lock layout,
https://www.sqlite.org/walformat.html, ``WAL_WRITE_LOCK``).
:class:`WriterProbe` asks the kernel whether another open file holds it
(``F_OFD_GETLK``, which also sees locks of this process's other
connections), taking no lock itself. Free *before* the version is read, every
commit heard so far is in that version; held, a commit may still be on its
way, and whoever asked owes a look again once it is free.

One caveat of POSIX record locks: closing any descriptor of a file drops
every lock this process holds on it. The probe's descriptor is therefore
closed only with the store reader's own connection
(:meth:`capsuled.reader.store.OwnershipReader.close`); another connection to the
same store in the same process (a writer kit in a test) loses its locks then.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import sys
import threading
from typing import Final

__all__ = ["WAL_WRITE_LOCK_OFFSET", "WriterProbe"]

#: The byte of the ``-shm`` file a WAL writer locks for its whole transaction.
WAL_WRITE_LOCK_OFFSET: Final = 120
#: ``struct flock`` on 64-bit Linux: type, whence, (pad), start, len, pid, (pad).
_FLOCK: Final = struct.Struct("hhxxxxqqi4x")
#: ``F_OFD_GETLK`` where the platform has it (Linux 3.15 and later).
_GETLK: Final[int] = getattr(fcntl, "F_OFD_GETLK", -1)
_SUPPORTED: Final = sys.platform.startswith("linux") and _GETLK >= 0 and _FLOCK.size == 32


class WriterProbe:
    """Asks whether some connection holds the store's WAL write lock.

    Thread-safe: the event loop may ask while an observation's worker
    thread uses the store reader.

    Args:
        store: the database path; the lock lives in ``<store>-shm``.
    """

    def __init__(self, store: str) -> None:
        self._shm = f"{store}-shm"
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None

    @property
    def supported(self) -> bool:
        """Whether this platform can tell (64-bit Linux); elsewhere :meth:`writing` says False."""
        return _SUPPORTED

    def writing(self) -> bool:
        """Whether a write transaction is open now (its commit may not be readable yet).

        False when the ``-shm`` file does not exist (no connection is in WAL
        mode), cannot be opened or is not a regular file, and where the
        platform cannot tell. Costs a ``stat`` and one ``fcntl``; takes no lock.
        """
        if not _SUPPORTED:
            return False
        with self._lock:
            fd = self._descriptor()
            if fd is None:
                return False
            asked = _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, WAL_WRITE_LOCK_OFFSET, 1, 0)
            try:
                answer = fcntl.fcntl(fd, _GETLK, asked)
            except OSError:
                return False
            return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)

    def close(self) -> None:
        """Close the descriptor (call it only after the store's connection is closed)."""
        with self._lock:
            self._close()

    def _descriptor(self) -> int | None:
        """The descriptor of the ``-shm`` file at the path now (reopened if it was replaced)."""
        try:
            st = os.stat(self._shm)
        except OSError:
            return None
        identity = (st.st_dev, st.st_ino)
        if self._fd is not None and identity == self._identity:
            return self._fd
        # Another file at the path: the connection, reopened with the store, uses it.
        self._close()
        try:
            fd = os.open(self._shm, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != identity or not stat.S_ISREG(opened.st_mode):
            os.close(fd)
            return None
        self._fd, self._identity = fd, identity
        return fd

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._identity = None
