"""Claude Code, as capsuled knows it (docs/design.md §12, docs/claude-code.md): the facts
its hook and ``capsulectl integrate claude-code`` share, and the hook's first decision.

* The session: Claude Code's ``session_id`` (a UUID; any 1-128 of ``[A-Za-z0-9_-]``
  starting with a letter or digit is taken) names the capsuled session
  ``ses_claude_<session_id>`` (:func:`session_name`); anything else is refused, never
  made into a path. A resume keeps Claude Code's id, so it keeps the session.
* The events the hook is registered for (:data:`HOOK_EVENTS`): ``SessionStart`` (the
  session, its root process, ``session_start``; on resume, the lost-work report),
  ``UserPromptSubmit`` (a task, or a background command's end), ``PostToolUse`` of
  ``Bash`` and ``TaskStop`` (a command detached, or stopped), ``Stop`` (commands that
  ended without a word). ``SessionEnd`` records nothing and is not registered.
* :func:`records`: whether an event records anything, decided with the standard
  library alone. A hook runs once per tool call, and most calls record nothing (any
  tool but a background ``Bash`` or ``TaskStop``): those end here, before msgspec,
  the store or the trace are loaded (docs/design.md §9 "Start-up", §12).

What it may import: the standard library, nothing of the package (the hook's
common path imports it and nothing else).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final

__all__ = [
    "AGENT",
    "HOOK_EVENTS",
    "ID_PATTERN",
    "RECORDED_EVENTS",
    "SESSION_PREFIX",
    "HookEvent",
    "records",
    "runs_background_command",
    "session_name",
]

#: The agent's name on the command line: ``capsulectl hook claude-code``.
AGENT: Final = "claude-code"
#: The capsuled session of a Claude Code session is this followed by Claude Code's id.
SESSION_PREFIX: Final = "ses_claude_"
#: What a Claude Code session id, and a background task id, may be: a letter or a digit,
#: then up to 127 letters, digits, ``_`` and ``-`` (Claude Code's are UUIDs and ``b…``).
ID_PATTERN: Final = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"


class HookEvent:
    """One event the hook is registered for, as ``integrate`` writes it.

    Attributes:
        name: Claude Code's event name.
        matcher: the tool names it fires for (a ``PostToolUse`` matcher), or None: all.
        timeout_s: how long Claude Code lets the hook run before it kills it; above the
            hook's own bounds on the store, the trace and the daemon, so that the hook
            gives up first and says why.
    """

    __slots__ = ("matcher", "name", "timeout_s")

    def __init__(self, name: str, timeout_s: int, matcher: str | None = None) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.matcher = matcher


#: The events ``capsulectl integrate claude-code`` registers the hook for, in this order.
HOOK_EVENTS: Final = (
    # The store, the trace, and on resume a reconcile and a look (10 s at most each).
    HookEvent("SessionStart", 30),
    HookEvent("UserPromptSubmit", 10),
    HookEvent("PostToolUse", 10, matcher="Bash|TaskStop"),
    HookEvent("Stop", 10),
)
#: The events the hook records something for (``PostToolUse`` only for some tools).
RECORDED_EVENTS: Final = frozenset(event.name for event in HOOK_EVENTS)


def session_name(claude_session_id: str) -> str:
    """The capsuled session of Claude Code's ``session_id`` (which must fit
    :data:`ID_PATTERN`, checked where the event is decoded): ``ses_claude_<id>``."""
    return SESSION_PREFIX + claude_session_id


def records(event: object) -> bool:
    """Whether the hook records anything for ``event``, the hook's input as ``json.loads``
    returned it; decided with the standard library alone.

    True for ``SessionStart``, ``UserPromptSubmit``, ``Stop``, a ``PostToolUse`` of
    ``TaskStop`` and of a ``Bash`` with ``run_in_background`` true; False for any other
    ``PostToolUse`` (the common case, once per tool call) and every other event.

    Raises:
        ValueError: ``event`` is not a JSON object.
    """
    if not isinstance(event, dict):
        raise ValueError(f"the hook's input is a JSON {type(event).__name__}, not an object")
    name = event.get("hook_event_name")
    if name != "PostToolUse":
        return name in RECORDED_EVENTS
    tool = event.get("tool_name")
    if tool == "TaskStop":
        return True
    tool_input = event.get("tool_input")
    return (
        tool == "Bash"
        and isinstance(tool_input, dict)
        and tool_input.get("run_in_background") is True
    )


def runs_background_command(argv: Sequence[str], command: str) -> bool:
    """Whether ``argv`` is the shell a background ``Bash`` runs ``command`` in: Claude Code
    runs it as ``SHELL -c '… eval 'COMMAND' < /dev/null …'``, the command always
    single-quoted, each ``'`` in it written ``'"'"'`` (tests/claude_code/FINDINGS.md §6)."""
    quoted = "eval '" + command.replace("'", "'\"'\"'") + "'"
    return len(argv) >= 3 and argv[1] == "-c" and quoted in argv[2]
