"""The session trace's lock and appends, and the writer kit (docs/design.md §6, §9).

A session's trace is ``<records root>/<session_id>/trace.jsonl``: one JSON
object per line, append-only.  Runtimes append their events with
:func:`append_event` or a :class:`TraceWriter`; the daemon's reconcile
(docs/design.md §6) reads the trace and appends ``shell_lost`` markers.

Every append is whole lines: the trace is opened ``O_APPEND``, an exclusive
advisory lock (``flock``) is taken on it, and the bytes go out in one
``os.write`` (repeated only if the kernel accepts fewer bytes).  If the file
does not end in a newline (a torn tail left by a crash), the new line starts
on a fresh line, so it never fuses with the torn one.  If a write fails part
way, the file is cut back to its size before the write.  Reconcile takes the
same lock for its scan and its markers, which is what makes "exactly once"
hold across processes.

The session directory (created ``0700``) and the trace (created ``0600``) are
opened relative to the records root without following symlinks.

The lines' shapes, ids and times are :mod:`.trace_format`'s; this module
gives them under its own name too, so a runtime imports the kit from one place.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from msgspec import UNSET, UnsetType

from ..wire.constants import TRACE_LOCK_TIMEOUT_S
from .paths import make_private_dirs
from .trace_format import (
    SessionStart,
    ShellAbandoned,
    ShellCompleted,
    ShellDetached,
    ShellLost,
    TaskStart,
    TraceEvent,
    Trust,
    detach_time,
    encode_line,
    is_session_directory_name,
    new_event_id,
    new_task_id,
    now_ms,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "TRACE_FILE_NAME",
    "LockWaitCancelled",
    "SessionStart",
    "ShellAbandoned",
    "ShellCompleted",
    "ShellDetached",
    "ShellLost",
    "TaskStart",
    "TraceEvent",
    "TraceWriter",
    "Trust",
    "append_event",
    "append_locked",
    "detach_time",
    "encode_line",
    "is_session_directory_name",
    "lock_trace",
    "locked_trace",
    "new_event_id",
    "new_task_id",
    "now_ms",
]

#: The trace's file name inside a session directory.
TRACE_FILE_NAME: Final = "trace.jsonl"

#: How long an append or a reconcile waits for another holder of the lock, seconds.
DEFAULT_LOCK_TIMEOUT_S: Final = TRACE_LOCK_TIMEOUT_S

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS: Final = (
    os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
)


# --------------------------------------------------------------------------
# Lock and append (shared with the daemon's reconcile)


class LockWaitCancelled(Exception):
    """The wait for a trace's lock was given up because the caller asked to stop."""


def lock_trace(
    fd: int,
    timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S,
    *,
    cancelled: Callable[[], bool] | None = None,
) -> None:
    """Take the trace's exclusive advisory lock (``flock``) on ``fd``.

    Closing ``fd`` releases it.

    Args:
        fd: an open descriptor of the trace.
        timeout_s: give up after this many seconds; ``None`` waits forever.
        cancelled: asked between attempts while another holder has the lock;
            ``True`` gives up the wait (a daemon shutting down).

    Raises:
        TimeoutError: another holder kept the lock past ``timeout_s``.
        LockWaitCancelled: ``cancelled()`` said so before the lock was taken.
        OSError: ``flock`` failed otherwise.
    """
    if timeout_s is None and cancelled is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + (float("inf") if timeout_s is None else timeout_s)
    delay_s = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if cancelled is not None and cancelled():
                raise LockWaitCancelled("gave up waiting for the trace's lock") from None
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise TimeoutError(
                    f"trace still locked by another writer after {timeout_s} s"
                ) from None
            time.sleep(min(delay_s, remaining_s))
            delay_s = min(delay_s * 2, 0.02)


def append_locked(fd: int, payload: bytes, *, fsync: bool) -> None:
    """Append whole lines to a trace whose lock the caller holds.

    If the file does not end in ``\\n`` (a torn tail), a ``\\n`` goes first.
    The bytes go out in one ``os.write``, repeated only for a short write.  If
    any write (or the fsync) fails, the file is cut back to its size before
    the append and the error is raised, so a failed append leaves no part of
    ``payload`` behind.

    Args:
        fd: the trace, opened ``O_RDWR | O_APPEND``, its lock held.
        payload: one or more ``\\n``-terminated lines.
        fsync: flush the file to stable storage before returning.

    Raises:
        OSError: the write, or the fsync, failed (the cause, unchanged).
    """
    size = os.fstat(fd).st_size
    if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
        payload = b"\n" + payload
    try:
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, "write to the trace made no progress")
            view = view[written:]
        if fsync:
            os.fsync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, size)
        except OSError as truncate_error:  # pragma: no cover - a disk failing twice
            exc.add_note(f"cutting the trace back to {size} bytes also failed: {truncate_error}")
        raise


def _open_for_append(records_root: str | os.PathLike[str], session_id: str) -> int:
    """Open (creating as needed) ``<records_root>/<session_id>/trace.jsonl`` for append."""
    make_private_dirs(Path(records_root))
    root_fd = os.open(records_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.mkdir(session_id, 0o700, dir_fd=root_fd)
        except FileExistsError:
            pass
        try:
            dir_fd = os.open(session_id, _DIR_FLAGS, dir_fd=root_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                os.stat(session_id, dir_fd=root_fd, follow_symlinks=False).st_mode
            ):
                raise OSError(errno.ELOOP, "session directory is a symlink", session_id) from exc
            raise
        try:
            fd = os.open(TRACE_FILE_NAME, _APPEND_FLAGS, 0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        os.close(root_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "trace is not a regular file", session_id)
    return fd


def append_event(
    records_root: str | os.PathLike[str],
    event: TraceEvent,
    *,
    fsync: bool = False,
    lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S,
) -> None:
    """Append one event, as one whole line, to its session's trace (docs/design.md §1).

    The session is ``event.session_id``; its directory (``0700``) and trace
    (``0600``) are created if missing.

    Args:
        records_root: ``<home>/sessions`` (see ``capsule_client.kit.paths.records_root``).
        event: the event; its ``session_id`` names the trace.
        fsync: flush to stable storage before returning.
        lock_timeout_s: how long to wait for the trace's lock; ``None``: forever.

    Raises:
        ValueError: ``event.session_id`` is not a session directory name.
        TimeoutError: the lock was held by another writer past ``lock_timeout_s``.
        OSError: the directory or the trace could not be opened or written;
            ``errno.ELOOP`` when the session directory or the trace is a symlink.
    """
    if not is_session_directory_name(event.session_id):
        raise ValueError(f"not a session directory name: {event.session_id!r}")
    line = encode_line(event)
    fd = _open_for_append(records_root, event.session_id)
    try:
        lock_trace(fd, lock_timeout_s)
        append_locked(fd, line, fsync=fsync)
    finally:
        os.close(fd)


@contextmanager
def locked_trace(
    records_root: str | os.PathLike[str],
    session_id: str,
    *,
    lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S,
) -> Iterator[int]:
    """A session's trace, opened for append as :func:`append_event` opens it, its lock
    held while the block runs: for a writer that reads what the trace says (``os.pread``)
    before it appends (:func:`append_locked`), so that no other writer nor a reconcile
    comes in between. The descriptor is closed, and the lock released, at the end.

    Raises:
        ValueError: ``session_id`` is not a session directory name.
        TimeoutError: the lock was held by another writer past ``lock_timeout_s``.
        OSError: as :func:`append_event`.
    """
    if not is_session_directory_name(session_id):
        raise ValueError(f"not a session directory name: {session_id!r}")
    fd = _open_for_append(records_root, session_id)
    try:
        lock_trace(fd, lock_timeout_s)
        yield fd
    finally:
        os.close(fd)


class TraceWriter:
    """Appends one session's events, filling ``event_id``, ``session_id`` and ``timestamp``.

    Each method writes one line (see :func:`append_event`) and returns the
    event id it wrote.  Not buffered: every call opens, locks, writes and
    closes, so several processes may write one trace.

    Args:
        records_root: ``<home>/sessions``.
        session_id: the session, ``ses_...``.
        fsync: flush each event to stable storage before returning.

    Raises:
        ValueError: ``session_id`` is not a session directory name.
    """

    def __init__(
        self, records_root: str | os.PathLike[str], session_id: str, *, fsync: bool = False
    ) -> None:
        if not is_session_directory_name(session_id):
            raise ValueError(f"not a session directory name: {session_id!r}")
        self.records_root = records_root
        self.session_id = session_id
        self.fsync = fsync

    def _append(self, kind: type[TraceEvent], **fields: Any) -> str:
        """Append one ``kind`` event of ``fields``, with its id, the session and the time."""
        event = kind(
            event_id=new_event_id(), session_id=self.session_id, timestamp=now_ms(), **fields
        )
        append_event(self.records_root, event, fsync=self.fsync)
        return event.event_id

    def session_start(self) -> str:
        """Append ``session_start``; its id becomes the parent of reconcile's markers."""
        return self._append(SessionStart)

    def task_start(
        self,
        task_id: str,
        trust: Trust,
        *,
        context_id: str | UnsetType = UNSET,
        source: str | UnsetType = UNSET,
        origin: str | UnsetType = UNSET,
        lane: str | UnsetType = UNSET,
    ) -> str:
        """Append ``task_start`` with the task's trust (``trusted`` / ``untrusted``)."""
        return self._append(
            TaskStart,
            task_id=task_id,
            trust=trust,
            context_id=context_id,
            source=source,
            origin=origin,
            lane=lane,
        )

    def shell_detached(
        self,
        work_id: str,
        binary: str,
        command: str,
        *,
        task_id: str,
        turn: int | UnsetType = UNSET,
        grace_ms: int | UnsetType = UNSET,
    ) -> str:
        """Append ``shell_detached``: ``work_id`` is now running in the background."""
        return self._append(
            ShellDetached,
            task_id=task_id,
            work_id=work_id,
            binary=binary,
            command=command,
            turn=turn,
            grace_ms=grace_ms,
        )

    def shell_completed(
        self,
        work_id: str,
        binary: str,
        command: str,
        *,
        exit_code: int | UnsetType | None = UNSET,
        duration_ms: int | UnsetType = UNSET,
        output_path: str | UnsetType = UNSET,
        output_bytes: int | UnsetType = UNSET,
        status: str | UnsetType = UNSET,
        completion_task_id: str | UnsetType = UNSET,
    ) -> str:
        """Append ``shell_completed``: ``work_id`` finished and is accounted for."""
        return self._append(
            ShellCompleted,
            work_id=work_id,
            binary=binary,
            command=command,
            exit_code=exit_code,
            duration_ms=duration_ms,
            output_path=output_path,
            output_bytes=output_bytes,
            status=status,
            completion_task_id=completion_task_id,
        )

    def shell_abandoned(
        self,
        work_id: str,
        binary: str,
        command: str,
        *,
        running_ms: int | UnsetType = UNSET,
    ) -> str:
        """Append ``shell_abandoned``: ``work_id`` was given up on and is accounted for."""
        return self._append(
            ShellAbandoned,
            work_id=work_id,
            binary=binary,
            command=command,
            running_ms=running_ms,
        )
