"""The ownership store's writer kit, for runtimes (docs/design.md §4, §9).

The store is a SQLite database (``<home>/capsule.db``, WAL mode,
``PRAGMA user_version = 1``) that says which session owns which input, exec
and process. Runtimes write it through :class:`OwnershipStore`; the daemon
only ever opens it read-only.

Schema (docs/design.md §4)::

    sessions(session_id TEXT PRIMARY KEY, context_id TEXT, title TEXT,
             created_at INTEGER NOT NULL)
    session_inputs(input_id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions)
    session_execs(exec_id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions)
    session_processes(pid INTEGER NOT NULL, started_at INTEGER NOT NULL,
                      session_id TEXT NOT NULL REFERENCES sessions,
                      PRIMARY KEY (pid, started_at))

Only the standard library's ``sqlite3`` is used.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from .paths import make_private_dirs
from .proc import process_start_time

__all__ = ["SCHEMA", "USER_VERSION", "OwnershipStore", "StoreVersionError"]

USER_VERSION: Final = 1

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
    PRIMARY KEY (pid, started_at)
);
"""

#: How long a writer waits for another writer's lock, in seconds.
BUSY_TIMEOUT_S: Final = 5.0


class StoreVersionError(RuntimeError):
    """The database at the path has a ``user_version`` this kit does not write."""


class OwnershipStore:
    """A read-write connection to the ownership store, creating it if needed.

    Each ``register_*`` call is its own transaction, so a reader never sees
    half of one. Use it as a context manager, or call :meth:`close`.

    Args:
        path: the database file, usually ``capsule_client.kit.paths.store_path(home)``;
            its directory is created ``0700`` if missing.
        busy_timeout_s: how long each statement waits for another writer's lock
            (an agent's hook, which must not hold the agent up, waits less).

    Raises:
        StoreVersionError: the file is a database with another ``user_version``.
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
            elif version != USER_VERSION:
                raise StoreVersionError(
                    f"{self.path} has user_version {version}, this kit writes {USER_VERSION}"
                )
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
        self, pid: int, session_id: str, *, started_at_s: float | None = None
    ) -> int:
        """Say that ``session_id`` owns the process ``pid`` with its current start time.

        Args:
            pid: the process id.
            session_id: the owning session.
            started_at_s: the process's start time; read from the OS when omitted.

        Returns:
            The start time recorded, whole Unix seconds.

        Raises:
            ProcessLookupError: no process ``pid`` (when ``started_at_s`` is omitted).
        """
        start = round(process_start_time(pid) if started_at_s is None else started_at_s)
        self._db.execute(
            "INSERT OR REPLACE INTO session_processes (pid, started_at, session_id)"
            " VALUES (?, ?, ?)",
            (pid, start, session_id),
        )
        return start

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
