"""A writer of the ownership store with one kept-open connection, in a process of its own.

A commit to a WAL store is heard (its WAL ``write``) before it can be read
(its index is published after the WAL is synced). :meth:`KeptWriter.write`
with ``stall`` holds a commit in that window as a slow disk would: it hears
the WAL write through inotify and stops the writer (``SIGSTOP``) for
:data:`STALL_S` before the commit is published (docs/design.md §5).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Final

import pytest

from helpers.waits import ChildOutput

#: How long a stalled commit waits between its WAL write and its publication, seconds.
STALL_S: Final = 0.05

_WRITER: Final = """
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=5, isolation_level=None)
print("ready", flush=True)
for line in sys.stdin:
    sql, args = json.loads(line)
    try:
        db.execute(sql, args)
    except sqlite3.Error as exc:
        print("error", exc, flush=True)
    else:
        print("ok", flush=True)
"""


class KeptWriter:
    """A process with one kept-open autocommit connection to the store, writing on request.

    :meth:`write` with ``stall`` stops it between its commit's WAL write (heard
    here through inotify) and the commit's publication, for :data:`STALL_S`.
    """

    def __init__(self, store: Path) -> None:
        inotify_simple = pytest.importorskip("inotify_simple")
        self._flags = inotify_simple.flags
        self._store = store
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(store)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._out = ChildOutput(self.process.stdout)
        assert self._out.line() == b"ready"
        self._inotify = inotify_simple.INotify()
        self._inotify.add_watch(str(store.parent), self._flags.MODIFY)
        self.stalls = 0

    def write(self, sql: str, args: tuple[object, ...], *, stall: bool = False) -> bytes:
        """One commit; with ``stall``, held between its WAL write and its publication.

        Returns ``b"ok"``, or ``b"error ..."`` with SQLite's message.
        """
        self._inotify.read(timeout=0)  # forget what came before
        staller = threading.Thread(target=self._stall) if stall else None
        if staller is not None:
            staller.start()
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps([sql, list(args)]).encode() + b"\n")
        self.process.stdin.flush()
        try:
            return self._out.line()
        finally:
            if staller is not None:
                staller.join(timeout=5)

    def _stall(self) -> None:
        wal = f"{self._store.name}-wal"
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if any(event.name == wal for event in self._inotify.read(timeout=100)):
                os.kill(self.process.pid, signal.SIGSTOP)
                try:
                    time.sleep(STALL_S)
                finally:
                    os.kill(self.process.pid, signal.SIGCONT)
                self.stalls += 1
                return

    def close(self) -> None:
        self._inotify.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
