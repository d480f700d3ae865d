"""Reconcile: background commands a prior session left unaccounted (docs/design.md §6).

When a session is resumed, :func:`reconcile` scans the prior session's trace
for work that was detached (``shell_detached``) and never accounted for
(``shell_completed``, ``shell_abandoned`` or ``shell_lost``), appends one
``shell_lost`` marker per such work to that trace, and returns a
:class:`~capsule_client.wire.LostReport` naming them, with the lowest
trust among the tasks that started them.

Exactly once: the scan and the append happen under the trace's exclusive
``flock`` (the same lock the writer kit ``capsule_client.kit.trace`` takes), so
concurrent reconciles — threads of one daemon or separate processes — report
each work once.  A caller whose reply was lost asks again with the same
``this_session`` and gets the same report, rebuilt from its own markers.

The scan (:mod:`capsuled.reconcile.trace_scan`) decodes every line with msgspec: exact
by construction, and as fast as a substring pre-filter (docs/reconcile.md).

All of this is blocking file I/O: the daemon runs it in a worker thread.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, ParamSpec

import msgspec

from capsule_client.kit.trace import (
    DEFAULT_LOCK_TIMEOUT_S,
    TRACE_FILE_NAME,
    LockWaitCancelled,
    ShellLost,
    Trust,
    append_locked,
    detach_time,
    encode_line,
    is_session_directory_name,
    lock_trace,
    new_event_id,
    new_task_id,
    now_ms,
)
from capsule_client.wire import LostReport, LostWork, Provenance
from capsuled.errors import InternalError, InvalidParams, NoSuchTrace, ShuttingDown, UnsafePath

from .trace_scan import READ_BUFFER_BYTES, DetachedWork, TraceScan, scan_lines

__all__ = ["Reconciled", "lost_message", "reconcile", "reconcile_marking"]

# --------------------------------------------------------------------------
# Report

P = ParamSpec("P")


def _detached(detached_at_ms: int) -> str:
    """When a work was detached, in milliseconds and as :func:`detach_time` shows it."""
    return f"at {detached_at_ms} ms since the Unix epoch ({detach_time(detached_at_ms)})"


#: Line breaks that JSON may leave unescaped (msgspec does) but ``str.splitlines``
#: and many renderers break lines at.
_UNESCAPED_LINE_BREAKS: Final = str.maketrans(
    {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _quoted(text: str) -> str:
    """``text`` as a JSON string on one line: every line break escaped."""
    return msgspec.json.encode(text).decode().translate(_UNESCAPED_LINE_BREAKS)


def _named(text: str) -> str:
    """An id as it is when printable, else quoted, so that it cannot start a line."""
    return text if text.isprintable() else _quoted(text)


def lost_message(started_in_session: str, lost: Sequence[LostWork]) -> str:
    """The report's text for the agent (docs/design.md §6).

    It names every lost work's id, binary, command (binary and command as JSON
    strings, and the session and work ids too when they are not printable, so
    that a line break in them cannot break the layout or forge a line) and
    detach time,
    and it does not begin with "Background shell command finished.": this is
    a loss, not a completion.
    """
    count = len(lost)
    noun = "command" if count == 1 else "commands"
    head = (
        f"Lost background work: session {_named(started_in_session)} detached {count} background "
        f"shell {noun} that never reported an outcome (no completion or abandonment was "
        "recorded), so whether each finished, failed or is still running is unknown. "
        "Each is now marked lost in that session's trace, so a later resume will not "
        "report it again."
    )
    items = [
        f"- {_named(work.work_id)}: binary {_quoted(work.binary)}, "
        f"command {_quoted(work.command)}, detached {_detached(work.detached_at_ms)}"
        for work in lost
    ]
    return "\n".join([head, *items])


def _report(
    from_session: str, context_id: str, task_id: str, lost: list[LostWork], trust: Trust
) -> LostReport:
    return LostReport(
        started_in_session=from_session,
        lost=lost,
        context_id=context_id,
        provenance=Provenance(origin="completion", trust=trust),
        task_id=task_id,
        message=lost_message(from_session, lost),
    )


# --------------------------------------------------------------------------
# Opening the trace safely


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _refuse_or_missing(exc: OSError, dir_fd: int, name: str, shown: str) -> None:
    """Raise the RPC error an ``O_NOFOLLOW`` open failure means; return if it means neither."""
    if exc.errno in (errno.ENOENT, errno.ENAMETOOLONG):
        raise NoSuchTrace(f"{shown} does not exist") from exc
    # Linux answers O_DIRECTORY|O_NOFOLLOW on a symlink with ENOTDIR, others with ELOOP.
    if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_symlink(dir_fd, name)):
        raise UnsafePath(f"{shown} is a symlink; refused") from exc
    if exc.errno in (errno.ENOTDIR, errno.EISDIR):
        raise NoSuchTrace(
            f"{shown} is not a {'trace file' if exc.errno == errno.EISDIR else 'directory'}"
        ) from exc


def _open_session_dir(root_fd: int, records_root: str, from_session: str) -> int:
    shown = f"session directory {os.path.join(records_root, from_session)}"
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(from_session, flags, dir_fd=root_fd)
    except OSError as exc:
        _refuse_or_missing(exc, root_fd, from_session, shown)
        raise InternalError(f"could not open {shown}: {exc}") from exc


def _open_trace_file(dir_fd: int, shown: str) -> tuple[int, OSError | None]:
    """Open the trace read-write, or read-only with the reason it is not writable."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    not_writable: OSError | None = None
    try:
        try:
            fd = os.open(TRACE_FILE_NAME, flags | os.O_RDWR | os.O_APPEND, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            not_writable = exc
            fd = os.open(TRACE_FILE_NAME, flags | os.O_RDONLY, dir_fd=dir_fd)
    except OSError as exc:
        _refuse_or_missing(exc, dir_fd, TRACE_FILE_NAME, shown)
        raise InternalError(f"could not open {shown}: {exc}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise NoSuchTrace(f"{shown} is not a trace file")
        raise UnsafePath(f"{shown} is not a regular file; refused")
    return fd, not_writable


def _open_trace(records_root: str, from_session: str) -> tuple[int, OSError | None]:
    """Open ``<root>/<from_session>/trace.jsonl``, following no symlink below the root."""
    try:
        root_fd = os.open(records_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NoSuchTrace(f"records root {records_root} does not exist") from exc
    except OSError as exc:
        raise InternalError(f"could not open records root {records_root}: {exc}") from exc
    try:
        dir_fd = _open_session_dir(root_fd, records_root, from_session)
        try:
            shown = f"trace {os.path.join(records_root, from_session, TRACE_FILE_NAME)}"
            return _open_trace_file(dir_fd, shown)
        finally:
            os.close(dir_fd)
    finally:
        os.close(root_fd)


# --------------------------------------------------------------------------
# Reconcile


def _scan_locked(fd: int, this_session: str) -> TraceScan:
    with open(fd, "rb", buffering=READ_BUFFER_BYTES, closefd=False) as trace:
        return scan_lines(trace, this_session=this_session)


def _markers(
    scan: TraceScan, pending: list[DetachedWork], from_session: str, this_session: str, task_id: str
) -> bytes:
    timestamp = now_ms()
    return b"".join(
        encode_line(
            ShellLost(
                event_id=new_event_id(),
                session_id=from_session,
                timestamp=timestamp,
                parent_id=scan.session_event_id,
                work_id=detached.work.work_id,
                binary=detached.work.binary,
                command=detached.work.command,
                detached_at_ms=detached.work.detached_at_ms,
                reconciled_by_session=this_session,
                reconciled_task_id=task_id,
            )
        )
        for detached in pending
    )


class Reconciled(NamedTuple):
    """What one reconcile answered, and whether it marked anything.

    Attributes:
        report: the report, or ``None`` when nothing is lost.
        marked: the report's markers were appended now; ``False`` for a report
            rebuilt from earlier markers (a retry after a lost reply), which
            the counters must not count again (docs/design.md §6).
    """

    report: LostReport | None
    marked: bool


def reconcile_marking(
    records_root: str | os.PathLike[str],
    from_session: str,
    this_session: str,
    context_id: str,
    *,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    cancelled: Callable[[], bool] | None = None,
) -> Reconciled:
    """Mark and report the background work ``from_session`` left unaccounted (docs/design.md §6).

    Under the trace's exclusive lock: scan it; append one ``shell_lost``
    marker per unaccounted work in one write, fsynced; then report them under
    a new task id.  If nothing is unaccounted but ``this_session`` already
    wrote markers (its earlier reply was lost), the report of its latest
    markers is rebuilt and nothing is written.

    Blocking: run it in a worker thread.

    Args:
        records_root: ``<home>/sessions``; it may itself be a symlink, nothing
            below it may.
        from_session: the prior session's directory name, ``ses_...``.
        this_session: the resuming session, recorded in the markers.
        context_id: echoed in the report.
        lock_timeout_s: how long to wait for another holder of the trace's lock.
        cancelled: asked while waiting for that lock; ``True`` gives up the
            wait before anything is read or written.

    Returns:
        The report (``None`` when nothing is lost, and nothing was written),
        and whether its markers were appended now.

    Raises:
        InvalidParams: ``from_session`` is not a session directory name
            (docs/design.md §6 "Names"), or ``this_session`` is empty; nothing is read.
        NoSuchTrace: the records root, the session directory or its trace
            does not exist.
        UnsafePath: the session directory or the trace is a symlink or not a
            regular file; nothing is read or written.
        ShuttingDown: ``cancelled()`` said so while the lock was held by
            another; nothing was read or written.
        InternalError: the trace could not be read or locked, or the markers
            could not be appended (the append is rolled back: nothing is
            reported, nothing is marked); the cause is chained.
    """
    if not is_session_directory_name(from_session):
        raise InvalidParams(
            "from_session",
            f"{from_session!r} is not a session directory name "
            "(it must start with 'ses_' and hold no '/', '\\', '..' or NUL)",
        )
    if not this_session:
        raise InvalidParams("this_session", "must not be empty")
    root = os.fspath(records_root)
    fd, not_writable = _open_trace(root, from_session)
    try:
        shown = os.path.join(root, from_session, TRACE_FILE_NAME)
        try:
            lock_trace(fd, lock_timeout_s, cancelled=cancelled)
            scan = _scan_locked(fd, this_session)
        except LockWaitCancelled:
            raise ShuttingDown(
                "the daemon is shutting down; the trace was not read and nothing was written"
            ) from None
        except OSError as exc:
            raise InternalError(f"could not read trace {shown}: {exc}") from exc
        pending = scan.unaccounted()
        if not pending:
            if scan.reconciled_task_id is None:
                return Reconciled(None, marked=False)
            lost = [scan.reconciled[work_id] for work_id in sorted(scan.reconciled)]
            trust = scan.trust_of(scan.reconciled)
            report = _report(from_session, context_id, scan.reconciled_task_id, lost, trust)
            return Reconciled(report, marked=False)
        task_id = new_task_id()
        payload = _markers(scan, pending, from_session, this_session, task_id)
        try:
            if not_writable is not None:
                raise not_writable
            append_locked(fd, payload, fsync=True)
        except OSError as exc:
            raise InternalError(
                f"could not append {len(pending)} shell_lost marker(s) to trace {shown}: {exc}; "
                "nothing is reported"
            ) from exc
    finally:
        os.close(fd)
    lost = [detached.work for detached in pending]
    trust = scan.trust_of(w.work_id for w in lost)
    return Reconciled(_report(from_session, context_id, task_id, lost, trust), marked=True)


def _report_only(marking: Callable[P, Reconciled]) -> Callable[P, LostReport | None]:
    def reconcile(*args: P.args, **kwargs: P.kwargs) -> LostReport | None:
        """Mark and report the background work ``from_session`` left unaccounted
        (docs/design.md §6): :func:`reconcile_marking`'s report alone, with the
        same arguments and errors."""
        return marking(*args, **kwargs).report

    return reconcile


reconcile = _report_only(reconcile_marking)
