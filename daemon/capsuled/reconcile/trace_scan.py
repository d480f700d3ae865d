"""Reconcile's trace scan: what a trace says was detached and accounted (docs/design.md §6).

One pass over the lines, each decoded on its own with msgspec; a line that
is not a JSON object is counted and skipped. Blocking file I/O when given a
path (:func:`scan_trace`); :func:`capsuled.reconcile.prior_session.reconcile` runs the same
scan on the locked trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from capsule_client.kit.trace_format import Trust
from capsule_client.wire import LostWork

__all__ = ["READ_BUFFER_BYTES", "DetachedWork", "TraceScan", "scan_lines", "scan_trace"]

#: Read buffer for the scan; memory is bounded by this plus the longest line.
READ_BUFFER_BYTES: Final = 1 << 20

#: An integer member at or above this counts as absent: ``detached_at_ms`` is an
#: unsigned 64-bit count of milliseconds (docs/design.md §6 "Scan").
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
# as absent (docs/design.md §6 "Scan").


def _string(value: Any) -> str:
    """A string member; ``""`` when it is absent or of another type."""
    return value if type(value) is str else ""


def _u64(value: Any) -> int:
    """An integer member in [0, 2**64); 0 when it is absent, of another type or out of range."""
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
    with open(path, "rb", buffering=READ_BUFFER_BYTES) as trace:
        return scan_lines(trace, this_session=this_session)
