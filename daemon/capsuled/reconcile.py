"""Reconcile: background commands a prior session left unaccounted (docs/design.md §6).

When a session is resumed, :func:`reconcile` scans the prior session's trace
for work that was detached (``shell_detached``) and never accounted for
(``shell_completed``, ``shell_abandoned`` or ``shell_lost``), appends one
``shell_lost`` marker per such work to that trace, and returns a
:class:`~capsule_client.protocol.LostReport` naming them, with the lowest
trust among the tasks that started them.

Exactly once: the scan and the append happen under the trace's exclusive
``flock`` (the same lock the writer kit ``capsule_client.trace`` takes), so
concurrent reconciles — threads of one daemon or separate processes — report
each work once.  A caller whose reply was lost asks again with the same
``this_session`` and gets the same report, rebuilt from its own markers.

The scan decodes every line with msgspec: measured on traces like the ones
runtimes write, decoding every line was as fast as any substring pre-filter
(see docs/reconcile.md), and it is exact by construction.

All of this is blocking file I/O: the daemon runs it in a worker thread.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from capsule_client._render import detach_time
from capsule_client.protocol import LostReport, LostWork, Provenance
from capsule_client.trace import (
    DEFAULT_LOCK_TIMEOUT_S,
    TRACE_FILE_NAME,
    LockWaitCancelled,
    ShellLost,
    Trust,
    append_locked,
    encode_line,
    is_session_directory_name,
    lock_trace,
    new_event_id,
    new_task_id,
    now_ms,
)
from capsuled.errors import InternalError, InvalidParams, NoSuchTrace, ShuttingDown, UnsafePath

__all__ = [
    "DetachedWork",
    "TraceScan",
    "lost_message",
    "reconcile",
    "scan_lines",
    "scan_trace",
]

#: Read buffer for the scan; memory is bounded by this plus the longest line.
_READ_BUFFER_BYTES: Final = 1 << 20

#: JSON numbers above this are not a ``u64`` in the original reconcile and count as absent.
_U64_LIMIT: Final = 1 << 64

#: Every JSON object is a record, also one holding a number no float can hold
#: (``1e400`` decodes to ``inf`` instead of failing the line).
_decode: Final = msgspec.json.Decoder(float_hook=float).decode


@dataclass(slots=True)
class DetachedWork:
    """A ``shell_detached`` record: the work and the task that started it."""

    work: LostWork
    task_id: str | None


@dataclass(slots=True)
class TraceScan:
    """What one scan of a trace found (docs/design.md §6 "Scan").

    Attributes:
        session_event_id: ``event_id`` of the last ``session_start`` (``None``
            without one, or when the last one has no string ``event_id``).
        detached: work id → the last ``shell_detached`` record for it.
        accounted: work ids with a ``shell_completed``, ``shell_abandoned``
            or ``shell_lost`` record.
        task_trust: task id → ``trusted`` / ``untrusted`` from ``task_start``.
        reconciled_task_id: the task id of the latest markers written for the
            session the scan was asked about (``this_session``), if any.
        reconciled: work id → work, from those markers.
        lines: lines read, the torn tail included.
        skipped_lines: lines that were not a JSON object.
        bytes: bytes read.
    """

    session_event_id: str | None = None
    detached: dict[str, DetachedWork] = field(default_factory=dict)
    accounted: set[str] = field(default_factory=set)
    task_trust: dict[str, Trust] = field(default_factory=dict)
    reconciled_task_id: str | None = None
    reconciled: dict[str, LostWork] = field(default_factory=dict)
    lines: int = 0
    skipped_lines: int = 0
    bytes: int = 0

    def unaccounted(self) -> list[DetachedWork]:
        """Detached minus accounted, ordered by work id (docs/design.md §6)."""
        return [
            self.detached[work_id]
            for work_id in sorted(self.detached)
            if work_id not in self.accounted
        ]

    def trust_of(self, work_ids: Iterable[str]) -> Trust:
        """``untrusted`` if any work's task is untrusted or unknown, else ``trusted``."""
        for work_id in work_ids:
            detached = self.detached.get(work_id)
            task_id = detached.task_id if detached is not None else None
            if task_id is None or self.task_trust.get(task_id) != "trusted":
                return "untrusted"
        return "trusted"


# --------------------------------------------------------------------------
# Scan


# One handler per event type that matters; a member of the wrong type counts
# as absent, as in the original reconcile (``as_str()`` / ``as_u64()`` with defaults).


def _string(value: Any) -> str:
    """A member as the original reconcile's ``as_str().unwrap_or_default()``."""
    return value if type(value) is str else ""


def _u64(value: Any) -> int:
    """A member as the original reconcile's ``as_u64().unwrap_or_default()``.

    An int in [0, 2**64), else 0.
    """
    return value if type(value) is int and 0 <= value < _U64_LIMIT else 0


def _on_session_start(scan: TraceScan, record: dict[str, Any], this_session: str | None) -> None:
    event_id = record.get("event_id")
    scan.session_event_id = event_id if type(event_id) is str else None


def _on_task_start(scan: TraceScan, record: dict[str, Any], this_session: str | None) -> None:
    task_id = record.get("task_id")
    trust = record.get("trust")
    if type(task_id) is str and (trust == "trusted" or trust == "untrusted"):
        scan.task_trust[task_id] = trust


def _on_shell_detached(scan: TraceScan, record: dict[str, Any], this_session: str | None) -> None:
    work_id = record.get("work_id")
    if type(work_id) is not str:
        return
    get = record.get
    task_id = get("task_id")
    work = LostWork(
        work_id, _string(get("binary")), _string(get("command")), _u64(get("timestamp"))
    )
    scan.detached[work_id] = DetachedWork(work, task_id if type(task_id) is str else None)


def _on_accounting(scan: TraceScan, record: dict[str, Any], this_session: str | None) -> None:
    work_id = record.get("work_id")
    if type(work_id) is str:
        scan.accounted.add(work_id)


def _on_shell_lost(scan: TraceScan, record: dict[str, Any], this_session: str | None) -> None:
    work_id = record.get("work_id")
    if type(work_id) is not str:
        return
    scan.accounted.add(work_id)
    task_id = record.get("reconciled_task_id")
    if (
        this_session is None
        or type(task_id) is not str
        or record.get("reconciled_by_session") != this_session
    ):
        return
    if task_id != scan.reconciled_task_id:
        scan.reconciled_task_id = task_id
        scan.reconciled = {}
    get = record.get
    scan.reconciled[work_id] = LostWork(
        work_id, _string(get("binary")), _string(get("command")), _u64(get("detached_at_ms"))
    )


_Handler = Callable[[TraceScan, dict[str, Any], str | None], None]

_HANDLERS: Final[dict[str, _Handler]] = {
    "session_start": _on_session_start,
    "task_start": _on_task_start,
    "shell_detached": _on_shell_detached,
    "shell_completed": _on_accounting,
    "shell_abandoned": _on_accounting,
    "shell_lost": _on_shell_lost,
}


class _Kind(msgspec.Struct):
    """Just a record's ``event_type``: decoding it skips the rest of the line quickly."""

    event_type: Any = None


_decode_kind: Final = msgspec.json.Decoder(_Kind).decode


def _record(scan: TraceScan, line: bytes, this_session: str | None) -> bool:
    """Decode one line whole and apply it to ``scan``; ``False`` if it is not a JSON object."""
    try:
        record = _decode(line)
    except (msgspec.DecodeError, RecursionError):
        # RecursionError: nested deeper than the decoder recurses; the line is
        # skipped like any other that cannot be read.
        return False
    if type(record) is not dict:
        return False
    event_type = record.get("event_type")
    if type(event_type) is str and (handler := _HANDLERS.get(event_type)) is not None:
        handler(scan, record, this_session)
    return True


def scan_lines(lines: Iterable[bytes], *, this_session: str | None = None) -> TraceScan:
    """Scan trace lines (docs/design.md §6 "Scan"), each decoded on its own.

    A line that is not a JSON object — a torn tail, garbage, NUL bytes,
    invalid UTF-8, JSON of another type — is counted and skipped; the lines
    around it still count. So is an object nested deeper than the decoder's
    recursion limit (about 1,000 levels), which cannot be read.  Members of
    the wrong type count as absent.

    Most lines are not relevant records (model output, tool calls): the event
    type alone tells, and msgspec reads it while skipping the rest of the line
    at a fraction of a full decode's cost. Duplicate keys resolve as in a dict
    (the last wins), so a line is passed over only when decoding it whole
    would pass it over too; a line the event-type decode cannot read is
    decoded whole, which decides. This loop runs once per line of a 100 MB
    trace, so it is written flat.

    Args:
        lines: the trace's lines, each with or without its ``\\n``.
        this_session: also collect the latest ``shell_lost`` markers this
            session wrote (for a retry after a lost reply).

    Returns:
        The scan's findings.
    """
    scan = TraceScan()
    decode_kind, handlers, record = _decode_kind, _HANDLERS, _record
    count = skipped = size = 0
    for line in lines:
        count += 1
        size += len(line)
        try:
            kind = decode_kind(line).event_type
        except (msgspec.DecodeError, RecursionError):
            pass  # not an object, not JSON, or too deep: the whole decode decides
        else:
            if kind.__class__ is not str or kind not in handlers:
                continue
        if not record(scan, line, this_session):
            skipped += 1
    scan.lines, scan.skipped_lines, scan.bytes = count, skipped, size
    return scan


def scan_trace(path: str | os.PathLike[str], *, this_session: str | None = None) -> TraceScan:
    """Scan one trace file by path, streaming; takes no lock (a benchmark entry point).

    Memory is bounded by the read buffer plus the longest line, not by the
    file.  :func:`reconcile` uses the same scan on the locked trace.

    Raises:
        OSError: the file could not be opened or read.
    """
    with open(path, "rb", buffering=_READ_BUFFER_BYTES) as trace:
        return scan_lines(trace, this_session=this_session)


# --------------------------------------------------------------------------
# Report


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
    with open(fd, "rb", buffering=_READ_BUFFER_BYTES, closefd=False) as trace:
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


def reconcile(
    records_root: str | os.PathLike[str],
    from_session: str,
    this_session: str,
    context_id: str,
    *,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    cancelled: Callable[[], bool] | None = None,
) -> LostReport | None:
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
        The report, or ``None`` when nothing is lost (and nothing was written).

    Raises:
        InvalidParams: ``from_session`` is not a session directory name (the
            original reconcile's rule), or ``this_session`` is empty; nothing is read.
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
                return None
            lost = [scan.reconciled[work_id] for work_id in sorted(scan.reconciled)]
            trust = scan.trust_of(scan.reconciled)
            return _report(from_session, context_id, scan.reconciled_task_id, lost, trust)
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
    return _report(from_session, context_id, task_id, lost, scan.trust_of(w.work_id for w in lost))
