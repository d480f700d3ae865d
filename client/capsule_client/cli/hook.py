"""``capsulectl hook AGENT``: one hook event of an agent on stdin, recorded
(docs/design.md §12). ``claude-code`` is the agent there is.

The hook fails open: whatever happens — bad or unknown JSON, an odd id, a locked
store, a full disk, an unwritable home, no daemon — it exits 0, says what went wrong
on one line of stderr, and has written nothing half-way; Claude Code runs on exactly
as without it (an exit status of 2 would block the agent). Only an agent name it does
not know, or a terminal for stdin, exits 1.

It starts fast (docs/design.md §9 "Start-up", §12): ``capsulectl hook claude-code``
is answered before the command line parser is loaded, and an event that records
nothing (most ``PostToolUse``) is decided with the standard library's ``json`` alone;
msgspec, the store and the trace are loaded only to record.

``CAPSULE_HOOK_LOG=FILE`` appends one JSON line per run to FILE: the event, what was
recorded, what failed.
"""

from __future__ import annotations

import os
import sys

from .exits import EXIT_OK, EXIT_REMOTE_ERROR

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from pathlib import Path
    from typing import Any, Final

__all__ = ["AGENTS", "LOG_VARIABLE", "MAX_INPUT_BYTES", "arguments", "run", "run_hook"]

#: The agents ``capsulectl hook`` knows.
AGENTS: Final = ("claude-code",)
#: Where each run appends one JSON line saying what it did, when set.
LOG_VARIABLE: Final = "CAPSULE_HOOK_LOG"
#: The longest event read (a ``PostToolUse`` carries the tool's output, up to some 30 KB).
MAX_INPUT_BYTES: Final = 64 * 1024 * 1024


def arguments(parser: argparse.ArgumentParser) -> None:
    """``AGENT``."""
    parser.add_argument(
        "agent",
        metavar="AGENT",
        choices=AGENTS,
        help="the agent whose hook event is on stdin: " + ", ".join(AGENTS),
    )


def run(args: argparse.Namespace, socket_path: Path) -> int:
    """The command, reached through the parser (an option before ``hook``)."""
    return run_hook(args.agent, socket_path)


def run_hook(agent: str, socket_path: Path | None = None) -> int:
    """Read one event of ``agent`` on stdin and record it; 0 whatever the event does.

    Args:
        agent: ``claude-code``.
        socket_path: the daemon's socket; None: the default (docs/design.md §2).
    """
    if agent not in AGENTS:
        print(
            f"capsulectl hook: no agent {agent!r}; the agents are: {', '.join(AGENTS)}",
            file=sys.stderr,
        )
        return EXIT_REMOTE_ERROR
    if sys.stdin is None or sys.stdin.isatty():
        print(
            f"capsulectl hook {agent}: reads one hook event (JSON) on stdin, as the agent "
            f"gives it: `capsulectl integrate {agent}` registers it",
            file=sys.stderr,
        )
        return EXIT_REMOTE_ERROR
    import json

    record: dict[str, Any] = {"agent": agent, "event": None}
    problems: list[str] = []
    output: str | None = None
    try:
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise ValueError(f"the event is longer than {MAX_INPUT_BYTES} bytes")
        event = json.loads(data)
        from ..agents.claude_code import records

        wanted = records(event)
        record["event"] = event.get("hook_event_name")
        if wanted:
            output = _record(str(record["event"]), data, socket_path, record, problems)
    except json.JSONDecodeError as exc:
        problems.append(f"the input is not JSON ({exc}): nothing recorded")
    except ValueError as exc:  # not an object, too long, not UTF-8
        problems.append(f"{exc}: nothing recorded")
    except Exception as exc:  # the hook itself: said, never passed on to the agent
        problems.append(f"{exc.__class__.__name__}: {exc} (nothing more recorded)")
    if output is not None:
        try:
            sys.stdout.write(output)
            sys.stdout.flush()
        except OSError as exc:
            problems.append(f"its answer could not be written: {exc}")
    if problems:
        line = "; ".join(" ".join(problem.split()) for problem in problems)
        print(f"capsulectl hook {agent}: {record['event'] or 'event'}: {line}", file=sys.stderr)
    _log(record | {"problems": problems, "answered": output is not None})
    return EXIT_OK


def _record(
    event_name: str,
    data: bytes,
    socket_path: Path | None,
    record: dict[str, Any],
    problems: list[str],
) -> str | None:
    """Record the event through the agent's hook module; its answer for stdout, if any."""
    import msgspec

    from ..agents.claude_code_hook import handle
    from ..agents.claude_code_outcome import Places
    from ..kit.paths import default_home, default_socket

    home = default_home()
    places = Places(home, default_socket(home) if socket_path is None else socket_path)
    try:
        outcome = handle(event_name, data, os.environ, places)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        problems.append(f"the event does not fit ({exc}): nothing recorded")
        return None
    record["did"] = outcome.did
    problems.extend(outcome.problems)
    return outcome.output


def _log(record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``$CAPSULE_HOOK_LOG``, if set (best effort)."""
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    import json
    import time

    line = json.dumps({"at": time.time(), **record}, default=str) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass
