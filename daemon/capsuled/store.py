"""Read-only access to the ownership store (SPEC §4).

The daemon never writes the store: runtimes do, through
``capsule_client.store``. Each query opens the database with a
``file:...?mode=ro`` URI and a busy timeout of at least 1 s, reads in one
transaction and closes it again, so a store that is replaced or created
while the daemon runs is simply read the next time.

:meth:`OwnershipReader.version` tells whether the store may have changed
since it was last asked, without reading any table: the file's identity and
``PRAGMA data_version`` on one connection kept open for that purpose (the
value changes exactly when another connection commits). The reader asks
ownership again only when the version, the keys or the sampled pids changed.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

from capsule_client.store import USER_VERSION

__all__ = ["Ownership", "OwnershipReader", "StoreUnavailable", "StoreVersion"]

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
    unreadable, or of another ``user_version``. The message says which."""


@dataclass(frozen=True)
class Ownership:
    """Who owns the keys asked for (SPEC §4 ``session_process_ownership``).

    Attributes:
        inputs: input id → session id.
        execs: exec id → session id.
        processes: pid → ``(started_at, session_id)`` rows, sorted; a pid may
            have several rows when it was reused.
        contexts: session id → context id, for every session named above.
        gaps: what the answer could not cover (a missing store).
    """

    inputs: dict[str, str] = field(default_factory=dict)
    execs: dict[str, str] = field(default_factory=dict)
    processes: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    contexts: dict[str, str | None] = field(default_factory=dict)
    gaps: tuple[str, ...] = ()


def _chunks(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), CHUNK_SIZE):
        yield items[start : start + CHUNK_SIZE]


class OwnershipReader:
    """Answers ownership questions from the store at ``path``, read-only.

    Args:
        path: the store, usually ``capsule_client.paths.store_path(home)``.
        busy_timeout_s: how long a query waits for a lock; at least 1 s (SPEC §4).
    """

    def __init__(self, path: Path, *, busy_timeout_s: float = 1.0) -> None:
        if busy_timeout_s < 1.0:
            raise ValueError("busy_timeout_s must be at least 1 s (SPEC §4)")
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
        self._probe: sqlite3.Connection | None = None
        self._probe_identity: tuple[int, int] | None = None

    def version(self) -> StoreVersion:
        """A value that differs whenever the store may have changed since the last call.

        Two equal values mean that nobody committed to the same file in
        between (``PRAGMA data_version`` on a connection kept open for this;
        a replaced file has another identity). Cheap: one ``stat`` and one
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
            raise StoreUnavailable(f"ownership store {self.path} cannot be read: {exc}") from exc
        identity = (st.st_dev, st.st_ino)
        self._check_regular_files()
        try:
            if self._probe is None or self._probe_identity != identity:
                self.close()
                self._probe = sqlite3.connect(
                    self._uri,
                    uri=True,
                    timeout=self.busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
                self._probe_identity = identity
            (data_version,) = self._probe.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error as exc:
            self.close()
            raise StoreUnavailable(f"ownership store {self.path} cannot be read: {exc}") from exc
        return (*identity, int(data_version))

    def close(self) -> None:
        """Close the connection :meth:`version` keeps (the next call opens it again)."""
        if self._probe is not None:
            self._probe.close()
        self._probe = None
        self._probe_identity = None

    def session_process_ownership(
        self, inputs: Iterable[str], execs: Iterable[str], pids: Iterable[int]
    ) -> Ownership:
        """Which session owns each of the given input ids, exec ids and pids.

        Only the keys asked are read; long key lists are split into chunks of
        :data:`CHUNK_SIZE`. A missing store means nobody owns anything: the
        answer is empty, with a gap saying so.

        Raises:
            StoreUnavailable: the store exists but cannot be read (the message
                names the store and the cause).
        """
        if not self.path.exists():
            return Ownership(
                gaps=(f"ownership store {self.path} does not exist; nobody owns anything",)
            )
        self._check_regular_files()
        try:
            db = sqlite3.connect(
                self._uri, uri=True, timeout=self.busy_timeout_s, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"ownership store {self.path} cannot be opened: {exc}") from exc
        try:
            db.execute("BEGIN")
            return self._query(db, sorted(set(inputs)), sorted(set(execs)), sorted(set(pids)))
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"ownership store {self.path} cannot be read: {exc}") from exc
        finally:
            db.close()

    def _check_regular_files(self) -> None:
        """Refuse a store whose files are not regular files (a FIFO would block ``open``)."""
        for suffix in _STORE_SUFFIXES:
            name = f"{self.path}{suffix}"
            try:
                mode = os.stat(name).st_mode
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreUnavailable(
                    f"ownership store {self.path} cannot be opened: {name}: {exc.strerror}"
                ) from exc
            if not stat.S_ISREG(mode):
                raise StoreUnavailable(
                    f"ownership store {self.path} cannot be opened: {name} is not a regular file"
                )

    def _query(
        self, db: sqlite3.Connection, inputs: list[str], execs: list[str], pids: list[int]
    ) -> Ownership:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version != USER_VERSION:
            raise StoreUnavailable(
                f"ownership store {self.path} has user_version {version}, expected {USER_VERSION}"
            )
        owned_inputs = dict(self._select(db, "session_inputs", "input_id", inputs))
        owned_execs = dict(self._select(db, "session_execs", "exec_id", execs))
        processes: dict[int, list[tuple[int, str]]] = {}
        for pid_chunk in _chunks(pids):
            marks = ",".join("?" * len(pid_chunk))
            rows = db.execute(
                "SELECT pid, started_at, session_id FROM session_processes"
                f" WHERE pid IN ({marks}) ORDER BY pid, started_at",
                pid_chunk,
            )
            for pid, started_at, session_id in rows:
                processes.setdefault(pid, []).append((started_at, session_id))
        sessions = sorted(
            {*owned_inputs.values(), *owned_execs.values()}
            | {session for rows in processes.values() for _, session in rows}
        )
        contexts: dict[str, str | None] = {}
        for chunk in _chunks(sessions):
            marks = ",".join("?" * len(chunk))
            query = f"SELECT session_id, context_id FROM sessions WHERE session_id IN ({marks})"
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
