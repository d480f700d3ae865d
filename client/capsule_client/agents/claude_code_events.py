"""The hook events of Claude Code that capsuled records, as msgspec types, and the
``<task-notification>`` prompt read (docs/design.md §12; what each event carries is
measured in tests/claude_code/FINDINGS.md).

Claude Code's input is untrusted: each event is decoded into its type before anything
is recorded. Members capsuled does not read are ignored; a member it reads that has the
wrong type, or an id that does not fit :data:`~.claude_code.ID_PATTERN`, refuses the
whole event (:func:`decode` raises ``msgspec.ValidationError`` naming it).

What it may import: msgspec, the standard library and :mod:`.claude_code`.
"""

# Annotations are objects here, not strings, as in capsule_client.wire.

import re
from typing import Annotated, Any, Final, NamedTuple, TypeVar

import msgspec
from msgspec import Meta, Struct, field

from .claude_code import ID_PATTERN

__all__ = [
    "NOTIFICATION_TAG",
    "BackgroundTask",
    "BashInput",
    "BashResponse",
    "PostToolUse",
    "SessionStart",
    "Stop",
    "TaskEnd",
    "TaskStopInput",
    "TaskStopResponse",
    "UserPromptSubmit",
    "decode",
    "decode_part",
    "is_notification",
    "task_ends",
]

S = TypeVar("S", bound=Struct)

#: A Claude Code session id or a background task id (docs/design.md §12).
Id = Annotated[str, Meta(pattern=ID_PATTERN)]
#: The project directory, as the session's context (the store's and reconcile's bound).
Directory = Annotated[str, Meta(max_length=4096)]


class SessionStart(Struct):
    """``SessionStart``: a Claude Code process starts (or resumes, or forks) a session."""

    session_id: Id
    source: str = "startup"
    cwd: Directory = ""


class UserPromptSubmit(Struct):
    """``UserPromptSubmit``: a prompt the user typed, or a background task's notification."""

    session_id: Id
    prompt: str


class BashInput(Struct):
    """The ``Bash`` tool's input."""

    command: str
    run_in_background: bool = False


class BashResponse(Struct):
    """The ``Bash`` tool's result: a background command's task id."""

    backgroundTaskId: Id | None = None  # Claude Code's name


class TaskStopInput(Struct):
    """The ``TaskStop`` tool's input (``shell_id`` is its older name)."""

    task_id: Id | None = None
    shell_id: Id | None = None


class TaskStopResponse(Struct):
    """The ``TaskStop`` tool's result."""

    task_id: Id | None = None


class PostToolUse(Struct):
    """``PostToolUse``: a tool ran; its input and result are decoded by the tool."""

    session_id: Id
    tool_name: str
    tool_input: msgspec.Raw = field(default_factory=lambda: msgspec.Raw(b"{}"))
    tool_response: msgspec.Raw = field(default_factory=lambda: msgspec.Raw(b"{}"))


class BackgroundTask(Struct):
    """A background task ``Stop`` lists: one Claude Code still has in flight."""

    id: Id
    status: str = "running"


class Stop(Struct):
    """``Stop``: a turn ended; ``background_tasks`` are the tasks still in flight."""

    session_id: Id
    background_tasks: list[BackgroundTask] = field(default_factory=list)


EVENT_TYPES: Final[dict[str, type[Struct]]] = {
    "SessionStart": SessionStart,
    "UserPromptSubmit": UserPromptSubmit,
    "PostToolUse": PostToolUse,
    "Stop": Stop,
}

_decoders: dict[type[Struct], msgspec.json.Decoder[Any]] = {}


def _decoder(kind: type[S]) -> msgspec.json.Decoder[S]:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return decoder


def decode(event_name: str, data: bytes) -> Struct:
    """The event ``event_name`` (one of :data:`EVENT_TYPES`) decoded into its type.

    Raises:
        msgspec.ValidationError: a member it reads has the wrong type, or an id does
            not fit :data:`~.claude_code.ID_PATTERN`.
        msgspec.DecodeError: ``data`` is not JSON.
        KeyError: ``event_name`` is not an event the hook records.
    """
    return _decoder(EVENT_TYPES[event_name]).decode(data)


def decode_part(raw: msgspec.Raw, kind: type[S]) -> S:
    """A tool's input or result (``PostToolUse``'s ``tool_input``, ``tool_response``)
    decoded into ``kind``.

    Raises:
        msgspec.ValidationError: it does not fit ``kind``.
    """
    return _decoder(kind).decode(raw)


# --------------------------------------------------------------------------
# <task-notification>: a background task's end, fed to the model as a prompt

#: What a notification prompt begins with (after white space).
NOTIFICATION_TAG: Final = "<task-notification>"
_BLOCK: Final = re.compile(r"<task-notification>(.*?)</task-notification>", re.DOTALL)
_TASK_ID: Final = re.compile(r"<task-id>([^<]*)</task-id>")
_STATUS: Final = re.compile(r"<status>([^<]*)</status>")
_SUMMARY: Final = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)
_EXIT_CODE: Final = re.compile(r"exit code (-?\d{1,9})\b")
_ID: Final = re.compile(ID_PATTERN)


class TaskEnd(NamedTuple):
    """A background task's end, as one notification says it.

    Attributes:
        work_id: the task's id (its ``backgroundTaskId``).
        status: ``completed``, ``failed``, ``killed`` (its time limit) or ``stopped``
            (said on resume, of a task of the previous process, without looking).
        exit_code: the exit status the summary gives, or None.
    """

    work_id: str
    status: str
    exit_code: int | None


def is_notification(prompt: str) -> bool:
    """Whether a ``UserPromptSubmit`` prompt is Claude Code's notification of a
    background task (not a prompt the user typed): it begins with ``<task-notification>``."""
    return prompt.lstrip().startswith(NOTIFICATION_TAG)


def task_ends(prompt: str) -> list[TaskEnd]:
    """Each task end a notification prompt tells of, in order: blocks without a task id
    that fits, or without a status (a Monitor's ``<event>`` lines), tell of none."""
    ends = []
    for block in _BLOCK.findall(prompt):
        task_id, status = _TASK_ID.search(block), _STATUS.search(block)
        if task_id is None or status is None or not _ID.match(task_id.group(1)):
            continue
        summary = _SUMMARY.search(block)
        codes = _EXIT_CODE.findall(summary.group(1)) if summary is not None else []
        ends.append(
            TaskEnd(task_id.group(1), status.group(1).strip(), int(codes[-1]) if codes else None)
        )
    return ends
