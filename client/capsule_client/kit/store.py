"""The ownership store's writer kit, for runtimes (docs/design.md §4, §9).

The store is a SQLite database (``<home>/capsule.db``, WAL mode,
``PRAGMA user_version = 2``) that says which session owns which input, exec
and process. Runtimes write it through :class:`OwnershipStore`; the daemon
only ever opens it read-only.

Schema (docs/design.md §4)::

    sessions(session_id TEXT PRIMARY KEY, context_id TEXT, title TEXT,
             created_at INTEGER NOT NULL)
    session_inputs(input_id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions)
    session_execs(exec_id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions)
    session_processes(pid INTEGER NOT NULL, started_at INTEGER NOT NULL,
                      session_id TEXT NOT NULL REFERENCES sessions,
                      boot_id TEXT, start_ticks INTEGER,
                      PRIMARY KEY (pid, started_at))

``boot_id`` and ``start_ticks`` (version 2) are a process row's exact identity
(docs/design.md §14); NULL in rows written without it. A store of version 1
(the same tables without those two columns) is migrated when this kit opens it,
in the one transaction that checks the version: a reader sees version 1 or
version 2, never a half of the step. A store of a later version is refused
(:class:`StoreVersionError`): it was written by a newer kit.

Only the standard library's ``sqlite3`` is used.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from .paths import make_private_dirs
from .proc import ProcessStart, is_boot_id, process_start

__all__ = ["MIGRATIONS", "SCHEMA", "USER_VERSION", "OwnershipStore", "StoreVersionError"]

USER_VERSION: Final = 2

SCHEMA: Final = """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    context_id TEXT,
    title TEXT,
    created_at INTEGER NOT NULL
);
CREATE TABLE session_inputs (
    input_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions
);
CREATE TABLE session_execs (
    exec_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions
);
CREATE TABLE session_processes (
    pid INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions,
    boot_id TEXT,
    start_ticks INTEGER,
    PRIMARY KEY (pid, started_at)
);
"""

#: user_version → the statements that bring a store of that version to the next one.
MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (
        "ALTER TABLE session_processes ADD COLUMN boot_id TEXT",
        "ALTER TABLE session_processes ADD COLUMN start_ticks INTEGER",
    ),
}

#: How long a writer waits for another writer's lock, in seconds.
BUSY_TIMEOUT_S: Final = 5.0


class StoreVersionError(RuntimeError):
    """The database at the path has a ``user_version`` this kit neither writes nor migrates."""


class OwnershipStore:
    """A read-write connection to the ownership store, creating it if needed.

    Each ``register_*`` call is its own transaction, so a reader never sees
    half of one. Use it as a context manager, or call :meth:`close`.

    Args:
        path: the database file, usually ``capsule_client.kit.paths.store_path(home)``;
            its directory is created ``0700`` if missing.
        busy_timeout_s: how long each statement waits for another writer's lock
            (an agent's hook, which must not hold the agent up, waits less).

    A store of an earlier version is migrated to :data:`USER_VERSION` on open,
    in one transaction (:data:`MIGRATIONS`).

    Raises:
        StoreVersionError: the file is a database of a later ``user_version``
            (a newer kit wrote it), or of one no kit writes.
        sqlite3.Error: the file is not a database, or it is locked past ``busy_timeout_s``.
    """

    def __init__(self, path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        make_private_dirs(path.parent)
        self.path = path
        self._db = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        try:
            self._create_schema()
        except BaseException:
            self._db.close()
            raise

    def _create_schema(self) -> None:
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version == 0:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {USER_VERSION}")
            elif version > USER_VERSION:
                raise StoreVersionError(
                    f"{self.path} has user_version {version}, newer than this kit writes"
                    f" ({USER_VERSION}): a newer capsuled wrote it; upgrade this one"
                )
            elif version < 0:
                raise StoreVersionError(
                    f"{self.path} has user_version {version}, which no capsule kit writes"
                )
            else:
                while version < USER_VERSION:
                    for statement in MIGRATIONS[version]:
                        self._db.execute(statement)
                    version += 1
                self._db.execute(f"PRAGMA user_version = {USER_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def register_session(
        self,
        session_id: str,
        *,
        context_id: str | None = None,
        title: str | None = None,
        created_at_s: int | None = None,
    ) -> None:
        """Create or update a session.

        Args:
            session_id: the session's id, e.g. ``ses_...``.
            context_id: the context the session belongs to, shown in snapshots.
            title: a human title.
            created_at_s: Unix seconds; now when omitted.
        """
        created = int(time.time()) if created_at_s is None else created_at_s
        self._db.execute(
            "INSERT INTO sessions (session_id, context_id, title, created_at)"
            " VALUES (?, ?, ?, ?)"
            " ON CONFLICT (session_id) DO UPDATE SET"
            " context_id = excluded.context_id, title = excluded.title",
            (session_id, context_id, title, created),
        )

    def ensure_session(
        self, session_id: str, *, context_id: str | None = None, title: str | None = None
    ) -> None:
        """Create the session if it is missing; set its context and title only where given.

        Unlike :meth:`register_session`, a resumed session keeps the context and
        title it has when they are not given again (``capsulectl run --session``).
        """
        self._db.execute(
            "INSERT INTO sessions (session_id, context_id, title, created_at)"
            " VALUES (?, ?, ?, ?)"
            " ON CONFLICT (session_id) DO UPDATE SET"
            " context_id = coalesce(excluded.context_id, context_id),"
            " title = coalesce(excluded.title, title)",
            (session_id, context_id, title, int(time.time())),
        )

    def register_input(self, input_id: str, session_id: str) -> None:
        """Say that ``session_id`` owns the input ``input_id`` (and its provider clients)."""
        self._db.execute(
            "INSERT OR REPLACE INTO session_inputs (input_id, session_id) VALUES (?, ?)",
            (input_id, session_id),
        )

    def register_exec(self, exec_id: str, session_id: str) -> None:
        """Say that ``session_id`` owns the exec ``exec_id`` (and its exec receipt's process)."""
        self._db.execute(
            "INSERT OR REPLACE INTO session_execs (exec_id, session_id) VALUES (?, ?)",
            (exec_id, session_id),
        )

    def register_process(
        self,
        pid: int,
        session_id: str,
        *,
        started_at_s: float | None = None,
        start: ProcessStart | None = None,
    ) -> int:
        """Say that ``session_id`` owns the process ``pid`` with its current start.

        On Linux the row carries the process's exact identity (boot id, start
        ticks) beside its start time, read from the OS with it. A row of the
        same exact process under another start time (one written before a
        clock step, say) is replaced by this one: a process has one row.

        Args:
            pid: the process id.
            session_id: the owning session.
            started_at_s: the process's start time, recorded alone (no boot id or
                ticks: the daemon then compares it within the tolerance).
            start: the process's start as
                :func:`capsule_client.kit.proc.process_start` reads it. When
                neither is given, it is read from the OS now.

        Returns:
            The start time recorded, whole Unix seconds (:meth:`release_process`'s key).

        Raises:
            ProcessLookupError: no process ``pid`` (when the start is read from the OS).
            ValueError: both ``started_at_s`` and ``start`` are given, or
                ``start`` has only one of its boot id and ticks, or a boot id
                not written as the kernel writes one.
        """
        if start is None:
            start = process_start(pid) if started_at_s is None else ProcessStart(started_at_s)
        elif started_at_s is not None:
            raise ValueError("give started_at_s or start, not both")
        if (start.boot_id is None) != (start.start_ticks is None):
            raise ValueError("a start's boot_id and start_ticks go together")
        if start.boot_id is not None and not is_boot_id(start.boot_id):
            raise ValueError(f"boot_id {start.boot_id!r} is not written as the kernel writes one")
        recorded = round(start.started_at_s)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if start.boot_id is not None:
                self._db.execute(
                    "DELETE FROM session_processes"
                    " WHERE pid = ? AND boot_id = ? AND start_ticks = ? AND started_at != ?",
                    (pid, start.boot_id, start.start_ticks, recorded),
                )
            self._db.execute(
                "INSERT OR REPLACE INTO session_processes"
                " (pid, started_at, session_id, boot_id, start_ticks) VALUES (?, ?, ?, ?, ?)",
                (pid, recorded, session_id, start.boot_id, start.start_ticks),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return recorded

    def release_process(self, pid: int, started_at_s: int) -> bool:
        """Drop the (pid, start) row: the process is no longer a session's own.

        Its descendants already seen stay listed until they exit (docs/design.md §5).
        Returns whether a row was dropped.
        """
        cursor = self._db.execute(
            "DELETE FROM session_processes WHERE pid = ? AND started_at = ?", (pid, started_at_s)
        )
        return cursor.rowcount > 0

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
