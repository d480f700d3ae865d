"""The session trace's lines: the events, their ids and times (docs/design.md §6).

One event is one JSON object on one line of ``trace.jsonl``, tagged by
``event_type``. Runtimes write them through :mod:`.trace` (the lock and the
append); the daemon's reconcile reads them and writes ``shell_lost``.

Event ids are ``evt_`` + 32 hex digits of a UUIDv7 (:func:`new_event_id`), for
the events runtimes write and the markers reconcile writes alike, so ids sort
by the time they were made; timestamps are Unix milliseconds.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Final, Literal

import msgspec
import uuid_utils
from msgspec import UNSET, Struct, UnsetType

__all__ = [
    "SessionStart",
    "ShellAbandoned",
    "ShellCompleted",
    "ShellDetached",
    "ShellLost",
    "TaskStart",
    "TraceEvent",
    "Trust",
    "detach_time",
    "encode_line",
    "is_session_directory_name",
    "new_event_id",
    "new_task_id",
    "now_ms",
]

Trust = Literal["trusted", "untrusted"]


class _Event(Struct, tag_field="event_type", omit_defaults=True):
    """Members every event has; ``event_type`` is the tag, written first."""

    event_id: str
    session_id: str
    timestamp: int


class SessionStart(_Event, tag="session_start"):
    """A session began; its ``event_id`` is the ``parent_id`` of reconcile's markers."""


class TaskStart(_Event, tag="task_start"):
    """A task began, with the trust its input deserves (docs/design.md §6)."""

    task_id: str
    trust: Trust
    context_id: str | UnsetType = UNSET
    source: str | UnsetType = UNSET
    origin: str | UnsetType = UNSET
    lane: str | UnsetType = UNSET


class ShellDetached(_Event, tag="shell_detached"):
    """A background command left running after its turn; ``timestamp`` is when."""

    task_id: str
    work_id: str
    binary: str
    command: str
    turn: int | UnsetType = UNSET
    grace_ms: int | UnsetType = UNSET


class ShellCompleted(_Event, tag="shell_completed"):
    """A detached command finished and its outcome was reported."""

    work_id: str
    binary: str
    command: str
    exit_code: int | UnsetType | None = UNSET
    duration_ms: int | UnsetType = UNSET
    output_path: str | UnsetType = UNSET
    output_bytes: int | UnsetType = UNSET
    status: str | UnsetType = UNSET
    completion_task_id: str | UnsetType = UNSET


class ShellAbandoned(_Event, tag="shell_abandoned"):
    """A detached command was given up on (killed or left) knowingly."""

    work_id: str
    binary: str
    command: str
    running_ms: int | UnsetType = UNSET


class ShellLost(_Event, tag="shell_lost"):
    """Reconcile's marker: the work was never accounted for (docs/design.md §6).

    Written only by the daemon.  It has no ``exit_code``, ``status``,
    ``duration_ms``, ``output_path`` or ``output_bytes``: nothing is known of
    the outcome.  ``parent_id`` is always present (null without a
    ``session_start``).
    """

    parent_id: str | None
    work_id: str
    binary: str
    command: str
    detached_at_ms: int
    reconciled_by_session: str
    reconciled_task_id: str


TraceEvent = SessionStart | TaskStart | ShellDetached | ShellCompleted | ShellAbandoned | ShellLost

_encoder: Final = msgspec.json.Encoder()


def encode_line(event: TraceEvent) -> bytes:
    """One event as one JSON line, ``\\n``-terminated (msgspec escapes newlines in strings)."""
    return _encoder.encode(event) + b"\n"


def new_event_id() -> str:
    """``evt_`` + 32 lowercase hex digits of a UUIDv7 (docs/design.md §6).

    Every event the project writes takes its id from here. UUIDv7 begins with
    the Unix time in milliseconds and the ids one process makes strictly
    increase, so a later id sorts after an earlier one.
    """
    return f"evt_{uuid_utils.uuid7().hex}"


def new_task_id() -> str:
    """``tsk_`` + 32 lowercase hex digits of a UUIDv7 (docs/design.md §6)."""
    return f"tsk_{uuid_utils.uuid7().hex}"


def now_ms() -> int:
    """The wall clock in Unix milliseconds."""
    return time.time_ns() // 1_000_000


def detach_time(detached_at_ms: int) -> str:
    """A work's ``detached_at_ms`` for people: ISO 8601 in UTC to the millisecond.

    ``"2025-11-29T07:06:40.123Z"``; ``"not recorded"`` for 0 (the trace's
    default when the member is absent, docs/design.md §6); ``"not a calendar
    date"`` for milliseconds past what a date can show. Both the reconcile
    report's text and ``capsulectl reconcile`` use it.
    """
    if detached_at_ms == 0:
        return "not recorded"
    try:
        when = datetime.fromtimestamp(detached_at_ms / 1000, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return "not a calendar date"
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def is_session_directory_name(name: str) -> bool:
    """Whether ``name`` may name a session directory (docs/design.md §6).

    It starts with ``ses_`` and holds no ``/``, ``\\``, ``..`` or NUL, so it
    can only name an entry directly inside the records root.
    """
    return (
        name.startswith("ses_")
        and "/" not in name
        and "\\" not in name
        and ".." not in name
        and "\0" not in name
    )
