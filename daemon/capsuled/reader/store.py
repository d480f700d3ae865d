"""Read-only access to the ownership store (docs/design.md §4).

The daemon never writes the store: runtimes do, through
``capsule_client.kit.store``. :class:`OwnershipReader` keeps one connection
open (``file:...?mode=ro``, busy timeout of at least 1 s) and reads each
answer in one read transaction. The connection is reopened when the file
at the path is another one (replaced, or created after being missing).

Change detection: ``PRAGMA data_version`` on that connection changes
exactly when another connection committed. Nothing is cached here: each
question reads the keys asked, and the reader (``capsuled.reader.ownership``)
asks only what it was not asked before while the version stays the same, so
an observation in which nothing was written costs two pragmas.

The store's versions: ``user_version`` 1 (process rows without an identity)
and 2 (``session_processes`` with ``boot_id`` and ``start_ticks``, written by
the kit since docs/design.md §14) are both read, a row of version 1 as one
without its identity. Any other version is refused with the reason and the
fix: a later one was written by a newer writer kit (upgrade capsuled), and
nothing is read of it, since a later schema may mean something this daemon
would misread.

A persistent connection matters for a second reason: opening and closing a
WAL database, even read-only, modifies its ``-wal`` and ``-shm`` files, and
the watcher reports writes to the store (``ChangeFeed.store_changed``): a
connection per query would make every observation wake the next one.

:meth:`OwnershipReader.version` tells whether the store may have changed
since it was last asked, without reading any table: the file's identity and
``PRAGMA data_version`` on that connection. The reader asks ownership again
only when the version, its candidates or the sampled pids changed, and its
stability check (docs/design.md §5 step 4) compares versions instead of querying again.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple, TypeVar

from capsule_client.kit.proc import is_boot_id
from capsule_client.kit.store import USER_VERSION
from capsuled.common.shortage import descriptors_short, is_shortage, shortage_gap

from .writer_probe import WriterProbe

__all__ = [
    "READ_VERSIONS",
    "Ownership",
    "OwnershipReader",
    "ProcessRow",
    "StoreUnavailable",
    "StoreVersion",
]

#: The ``user_version`` values this daemon reads (docs/design.md §4).
READ_VERSIONS: Final = range(1, USER_VERSION + 1)

#: The files SQLite opens by path for a store: the database, its WAL, its
#: shared-memory index, its rollback journal.
_STORE_SUFFIXES: Final = ("", "-wal", "-shm", "-journal")

#: Keys per ``IN (...)`` list; below SQLite's historical 999-variable limit.
CHUNK_SIZE: Final = 500

_T = TypeVar("_T")

#: What :meth:`OwnershipReader.version` returns: (device, inode, data_version),
#: or None while the store does not exist.
StoreVersion = tuple[int, int, int] | None


class StoreUnavailable(Exception):
    """The store exists but cannot be read: corrupt, locked past the timeout,
    unreadable, or of another ``user_version``. The message says which.

    ``shortage`` is the errno when the daemon, not the store, is short
    (out of descriptors or memory, docs/design.md §8); None otherwise.
    """

    def __init__(self, message: str, shortage: int | None = None) -> None:
        super().__init__(message)
        self.shortage = shortage


def _unavailable(message: str, exc: BaseException) -> StoreUnavailable:
    """A :class:`StoreUnavailable` for ``exc``: the shortage's gap when the daemon is short.

    SQLite's own errors carry no errno ("unable to open database file"):
    a probe tells whether the daemon can open a descriptor at all.
    """
    if is_shortage(exc):
        assert isinstance(exc, OSError)
        return StoreUnavailable(shortage_gap(exc.errno), exc.errno)
    if isinstance(exc, sqlite3.Error):
        nomem = getattr(exc, "sqlite_errorname", None) == "SQLITE_NOMEM"
        if nomem or descriptors_short():
            code = errno.ENOMEM if nomem else errno.EMFILE
            return StoreUnavailable(shortage_gap(code), code)
    return StoreUnavailable(message)


class ProcessRow(NamedTuple):
    """One ``session_processes`` row of a pid: who owns which process started when.

    ``boot_id`` and ``start_ticks`` are the process's exact identity (docs/design.md
    §14): both, or None for a row written without them (version 1, another
    platform) or with a pair that names no process (one of them NULL, a boot id
    not written as the kernel writes one, ticks that are not a whole number),
    which is then judged by ``started_at`` alone.
    """

    started_at: int
    session_id: str
    boot_id: str | None = None
    start_ticks: int | None = None


@dataclass(frozen=True)
class Ownership:
    """Who owns the keys asked for (docs/design.md §4 ``session_process_ownership``).

    Attributes:
        inputs: input id → session id.
        execs: exec id → session id.
        processes: pid → its :class:`ProcessRow` list, sorted by start; a pid
            may have several rows when it was reused.
        contexts: session id → context id, for every session named above.
        gaps: what the answer could not cover (a missing store).
    """

    inputs: dict[str, str] = field(default_factory=dict)
    execs: dict[str, str] = field(default_factory=dict)
    processes: dict[int, list[ProcessRow]] = field(default_factory=dict)
    contexts: dict[str, str | None] = field(default_factory=dict)
    gaps: tuple[str, ...] = ()


def _version_refused(path: Path, version: int) -> str:
    """Why a store of ``version`` is not read, and what to do about it."""
    known = f"this capsuled reads user_version {READ_VERSIONS[0]} to {READ_VERSIONS[-1]}"
    if version > READ_VERSIONS[-1]:
        return (
            f"ownership store {path} has user_version {version}, newer than {known}:"
            " a newer capsule writer kit wrote it; upgrade capsuled (the store is left as it is)"
        )
    return (
        f"ownership store {path} has user_version {version}, which no capsule writer kit"
        f" writes ({known}): it is not an ownership store; move it aside"
    )


def _chunks(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), CHUNK_SIZE):
        yield items[start : start + CHUNK_SIZE]


class OwnershipReader:
    """Answers ownership questions from the store at ``path``, read-only.

    Not thread-safe: one observation at a time uses it (the reader's single
    flight), from whichever worker thread runs it.

    Args:
        path: the store, usually ``capsule_client.kit.paths.store_path(home)``.
        busy_timeout_s: how long a query waits for a lock; at least 1 s (docs/design.md §4).
    """

    def __init__(self, path: Path, *, busy_timeout_s: float = 1.0) -> None:
        if busy_timeout_s < 1.0:
            raise ValueError("busy_timeout_s must be at least 1 s (docs/design.md §4)")
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
        self._db: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        #: Questions that read tables.
        self.queries = 0
        self._writer = WriterProbe(str(path))

    def writing(self) -> bool:
        """Whether a writer's transaction is open now: a commit heard may not be readable yet.

        Ask it before :meth:`version`: free then, every commit the watch has
        reported is in that version (``capsuled.reader.writer_probe``). Thread-safe.
        """
        return self._writer.writing()

    def close(self) -> None:
        """Close the connection (a later query opens it again)."""
        if self._db is not None:
            self._db.close()
        self._db = None
        self._identity = None
        self._writer.close()  # after the connection: closing it drops this process's locks

    def version(self) -> StoreVersion:
        """A value that differs whenever the store may have changed since the last call.

        Two equal values mean that nobody committed to the same file in
        between (``PRAGMA data_version`` on the kept connection; a replaced
        file has another identity). Cheap: a few ``stat`` calls and one
        pragma, no table read.

        Returns:
            (device, inode, data_version), or None when the store does not exist.

        Raises:
            StoreUnavailable: the store exists but cannot be opened or read.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.close()
            return None
        except OSError as exc:
            raise _unavailable(f"ownership store {self.path} cannot be read: {exc}", exc) from exc
        identity = (st.st_dev, st.st_ino)
        try:
            db = self._connect(identity)  # checks the files are regular when it opens
            ((data_version,),) = db.execute("PRAGMA data_version").fetchall()  # ends the read
        except sqlite3.Error as exc:
            self.close()
            raise _unavailable(f"ownership store {self.path} cannot be read: {exc}", exc) from exc
        return (*identity, int(data_version))

    def session_process_ownership(
        self, inputs: Iterable[str], execs: Iterable[str], pids: Iterable[int] | None
    ) -> Ownership:
        """Which session owns each of the given input ids, exec ids and pids.

        Only the keys asked are read, in one read transaction; long key lists
        are split into chunks of :data:`CHUNK_SIZE`. ``pids`` None reads every
        process row (the reader asks so when the store changed: the rows then
        name the pids it reads, docs/design.md §5). A missing store means nobody owns
        anything: the answer is empty, with a gap saying so.

        Raises:
            StoreUnavailable: the store exists but cannot be read (the message
                names the store and the cause).
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.close()
            return Ownership(
                gaps=(f"ownership store {self.path} does not exist; nobody owns anything",)
            )
        except OSError as exc:
            raise _unavailable(f"ownership store {self.path} cannot be read: {exc}", exc) from exc
        asked = sorted(set(inputs)), sorted(set(execs)), None if pids is None else sorted(set(pids))
        try:
            db = self._connect((st.st_dev, st.st_ino))
            db.execute("BEGIN")
            try:
                answer = self._read(db, *asked)
            finally:
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            self.close()
            raise _unavailable(f"ownership store {self.path} cannot be read: {exc}", exc) from exc
        except StoreUnavailable:
            self.close()
            raise
        return answer

    def _connect(self, identity: tuple[int, int]) -> sqlite3.Connection:
        if self._db is not None and self._identity == identity:
            return self._db
        self.close()
        self._check_regular_files()
        try:
            db = sqlite3.connect(
                self._uri,
                uri=True,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise _unavailable(f"ownership store {self.path} cannot be opened: {exc}", exc) from exc
        self._db, self._identity = db, identity
        return db

    def _check_regular_files(self) -> None:
        """Refuse a store whose files are not regular files (a FIFO would block ``open``)."""
        for suffix in _STORE_SUFFIXES:
            name = f"{self.path}{suffix}"
            try:
                mode = os.stat(name).st_mode
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _unavailable(
                    f"ownership store {self.path} cannot be opened: {name}: {exc.strerror}", exc
                ) from exc
            if not stat.S_ISREG(mode):
                raise StoreUnavailable(
                    f"ownership store {self.path} cannot be opened: {name} is not a regular file"
                )

    def _read(
        self, db: sqlite3.Connection, inputs: list[str], execs: list[str], pids: list[int] | None
    ) -> Ownership:
        """Inside a read transaction: the owners of the keys asked, and their contexts."""
        (version,) = db.execute("PRAGMA user_version").fetchone()  # starts the read
        if version == 0 and db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None:
            # Empty: its writer made the file and has not committed the schema yet.
            return Ownership(
                gaps=(f"ownership store {self.path} has no schema yet; nobody owns anything",)
            )
        if version not in READ_VERSIONS:
            raise StoreUnavailable(_version_refused(self.path, version))
        if not (inputs or execs or pids or pids is None):
            return Ownership()
        self.queries += 1
        owned_inputs = dict(self._select(db, "session_inputs", "input_id", inputs))
        owned_execs = dict(self._select(db, "session_execs", "exec_id", execs))
        processes: dict[int, list[ProcessRow]] = {}
        identity = "boot_id, start_ticks" if version >= 2 else "NULL, NULL"
        query = f"SELECT pid, started_at, session_id, {identity} FROM session_processes"
        rows: Iterable[tuple[int, int, str, object, object]]
        if pids is None:
            rows = db.execute(f"{query} ORDER BY pid, started_at")
        else:
            rows = (
                row
                for pid_chunk in _chunks(pids)
                for row in db.execute(
                    f"{query} WHERE pid IN ({','.join('?' * len(pid_chunk))})"
                    " ORDER BY pid, started_at",
                    pid_chunk,
                )
            )
        for pid, started_at, session_id, boot_id, start_ticks in rows:
            row = ProcessRow(started_at, session_id)
            if isinstance(boot_id, str) and isinstance(start_ticks, int) and is_boot_id(boot_id):
                row = ProcessRow(started_at, session_id, boot_id, start_ticks)
            processes.setdefault(pid, []).append(row)
        sessions = sorted(
            {*owned_inputs.values(), *owned_execs.values()}
            | {row.session_id for rows in processes.values() for row in rows}
        )
        contexts: dict[str, str | None] = {}
        for chunk in _chunks(sessions):
            marks = ",".join("?" * len(chunk))
            query = f"SELECT session_id, context_id FROM sessions WHERE session_id IN ({marks})"
            contexts.update(dict.fromkeys(chunk))
            contexts.update(db.execute(query, chunk))
        return Ownership(owned_inputs, owned_execs, processes, contexts)

    @staticmethod
    def _select(
        db: sqlite3.Connection, table: str, key: str, keys: list[str]
    ) -> Iterator[tuple[str, str]]:
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            yield from db.execute(
                f"SELECT {key}, session_id FROM {table} WHERE {key} IN ({marks})", chunk
            )
