"""Containment for runtimes: start a command as a session nothing escapes (docs/design.md §10).

:func:`spawn` is ``capsulectl run`` in one call: it starts CMD under the
launcher (a separate process that stays, a child subreaper registered as the
session's own (pid, start) row) and returns the launcher's process, whose exit
status is CMD's. The session's leftovers are then listed by the daemon as
descendants of the launcher, reported when CMD exits, and stoppable with
``session.terminate``.

>>> from capsule_client.kit.launcher import spawn
>>> launched = spawn(["npm", "run", "dev"], title="dev server")  # doctest: +SKIP
>>> launched.process.wait()                                       # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import uuid_utils

from .paths import store_path
from .store import OwnershipStore

__all__ = ["Spawned", "new_session_id", "register_launcher", "release_launcher", "spawn"]


def new_session_id() -> str:
    """A fresh session id, ``ses_<uuid7 hex>`` (time-ordered)."""
    return f"ses_{uuid_utils.uuid7().hex}"


def register_launcher(
    home: Path,
    session_id: str,
    *,
    title: str | None = None,
    context_id: str | None = None,
    pid: int | None = None,
) -> int:
    """Register the session (kept as it is where ``title``/``context_id`` are not given) and
    ``pid`` (default: this process) as its own (pid, start) row in the store of ``home``,
    with the process's exact identity on Linux (docs/design.md §14).

    Returns the start time recorded, whole Unix seconds (for :func:`release_launcher`).

    Raises:
        OSError, sqlite3.Error, capsule_client.kit.store.StoreVersionError: the store
            cannot be written.
    """
    with OwnershipStore(store_path(home)) as store:
        store.ensure_session(session_id, context_id=context_id, title=title)
        return store.register_process(os.getpid() if pid is None else pid, session_id)


def release_launcher(home: Path, pid: int, started_at_s: int) -> None:
    """Drop the launcher's row, so that ``session.terminate`` does not signal it; what it
    started stays listed as the session's descendants (docs/design.md §5)."""
    with OwnershipStore(store_path(home)) as store:
        store.release_process(pid, started_at_s)


class Spawned(NamedTuple):
    """A command started under the launcher."""

    #: The launcher; its exit status is CMD's (128 + N for signal N).
    process: subprocess.Popen[bytes]
    #: The session it runs as.
    session_id: str


def spawn(
    argv: Sequence[str],
    *,
    session_id: str | None = None,
    title: str | None = None,
    context_id: str | None = None,
    terminate_on_exit_s: float | None = None,
    wait: bool = False,
    socket: Path | None = None,
    **popen: Any,
) -> Spawned:
    """Start ``argv`` under ``capsulectl run`` (this interpreter, ``-m capsule_client.cli``).

    Args:
        argv: CMD and its arguments (looked up on ``PATH``).
        session_id: the session; a fresh ``ses_...`` when omitted.
        title, context_id: recorded on the session (as ``--title``, ``--context``).
        terminate_on_exit_s: terminate the session's leftovers when CMD exits,
            with this grace in seconds (``--terminate-on-exit=S``).
        wait: stay until the leftovers have exited (``--wait``).
        socket: the daemon's socket (default as docs/design.md §2 says).
        popen: passed to :class:`subprocess.Popen` (``stdin``, ``stdout``, ``env``...).

    Raises:
        ValueError: ``argv`` is empty.
        OSError: the launcher could not be started.
    """
    if not argv:
        raise ValueError("spawn needs a command")
    session = new_session_id() if session_id is None else session_id
    command = [sys.executable, "-m", "capsule_client.cli"]
    if socket is not None:
        command += ["--socket", str(socket)]
    command += ["run", "--session", session]
    if title is not None:
        command += ["--title", title]
    if context_id is not None:
        command += ["--context", context_id]
    if terminate_on_exit_s is not None:
        command.append(f"--terminate-on-exit={terminate_on_exit_s:g}")
    if wait:
        command.append("--wait")
    return Spawned(subprocess.Popen([*command, "--", *argv], **popen), session)
