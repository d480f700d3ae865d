"""`capsulectl run`: the session made and registered, CMD launched, the look and the report at
its exit, ``--terminate-on-exit`` and ``--wait`` (docs/design.md §10).

Exit status: CMD's (128 + N for signal N); before CMD runs, 2 bad usage,
1 the session could not be registered, 127 CMD not found, 126 not executable.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Final

from ..client import Client
from ..errors import CapsuleError, DaemonNotRunning, InvalidParams, NoSuchSession, RequestTimeout
from ..kit.launch import Launch, Terminal, exit_code, make_subreaper
from ..kit.launcher import new_session_id, register_launcher, release_launcher
from ..kit.paths import default_home
from ..kit.store import StoreVersionError
from ..text import argv_of, command_text, counted, duration, one_line
from ..wire import SessionProcess
from .exits import EXIT_USAGE
from .main import not_answering
from .options import DEFAULT_GRACE_S, grace_s

__all__ = ["arguments", "process_command_line", "render_leftovers", "run"]

#: Before CMD runs: the session could not be registered.
EXIT_REGISTER: Final = 1
EXIT_NOT_EXECUTABLE: Final = 126
EXIT_NOT_FOUND: Final = 127

EPILOG: Final = """\
CMD runs with the same terminal, its own process group in the foreground, and
CAPSULE_SESSION_ID, CAPSULE_HOME and CAPSULED_SOCKET set. The launcher is a child
subreaper: whatever CMD leaves behind ((cmd &), nohup, setsid, a double fork) is
re-parented to it and listed in the session as a descendant. When CMD exits the
launcher asks the daemon for one more look and lists on stderr what still runs,
with the command that stops it. It exits with CMD's status (128 + N for signal N).
What can still escape: a process something outside CMD's tree starts or moves
for it (systemd-run, sudo, a container runtime); see docs/design.md §10."""


def _session_id(text: str) -> str:
    if not text or not text.isprintable() or len(text) > 256:
        raise argparse.ArgumentTypeError(f"must be 1 to 256 printable characters, not {text!r}")
    return text


def arguments(parser: argparse.ArgumentParser) -> None:
    """``[--session ID] [--title T] [--context C] [--terminate-on-exit[=S]] [--wait] -- CMD``."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--session",
        metavar="ID",
        type=_session_id,
        help="the session to run as (default: a new ses_<uuid7>, said on stderr)",
    )
    parser.add_argument("--title", metavar="T", help="the session's title")
    parser.add_argument("--context", dest="context_id", metavar="C", help="the session's context")
    parser.add_argument(
        "--terminate-on-exit",
        metavar="GRACE_S",
        nargs="?",
        type=grace_s,
        const=DEFAULT_GRACE_S,
        help="when CMD exits, terminate what is left of the session: TERM, then KILL "
        f"after GRACE_S seconds (default: {DEFAULT_GRACE_S:g}; write it --terminate-on-exit=S)",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="when CMD exits, stay (reaping) until what it left has exited; "
        "TERM, INT or HUP ends the wait",
    )
    parser.add_argument("argv", metavar="-- CMD [ARG...]", nargs=argparse.REMAINDER)


def _say(text: str) -> None:
    print(f"capsulectl run: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, socket_path: Path) -> int:
    """Run ``capsulectl run``; returns the exit status (CMD's, once it ran)."""
    argv: list[str] = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        _say("no command given: capsulectl run [OPTIONS] -- CMD [ARG...]")
        return EXIT_USAGE
    home = default_home()
    session_id = args.session
    if session_id is None:
        session_id = new_session_id()
        _say(f"session {session_id}")
    try:
        started = register_launcher(home, session_id, title=args.title, context_id=args.context_id)
    except (OSError, sqlite3.Error, StoreVersionError) as exc:
        _say(f"cannot register session {one_line(session_id)} in {home}: {exc}")
        return EXIT_REGISTER
    why = _unreachable(socket_path, args.timeout)  # 10 s unless --timeout (the command table)
    if why is not None:
        _say(
            f"{why}: the command runs, but nothing looks at its processes and there is "
            "no report at its exit"
        )
    daemon = why is None
    why = make_subreaper()
    if why is not None:
        _say(f"{why}: processes the command leaves behind may escape the session")
    env = dict(os.environ)
    env.update(
        CAPSULE_SESSION_ID=session_id, CAPSULE_HOME=str(home), CAPSULED_SOCKET=str(socket_path)
    )
    terminal = Terminal()
    launch = Launch(argv, env, terminal)
    try:
        try:
            launch.start()
        except OSError as exc:
            _say(f"{one_line(argv[0])}: {exc.strerror or exc}")
            return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        code = exit_code(launch.wait())
        if daemon:
            _at_exit(args, socket_path, session_id, (os.getpid(), started), home, launch)
        return code
    finally:
        launch.close()


def _unreachable(socket_path: Path, timeout_s: float) -> str | None:
    """None when the daemon answers a ping; else why it does not, to say."""
    try:
        with Client(socket_path, timeout_s=timeout_s) as client:
            client.ping()
    except DaemonNotRunning:
        return f"capsuled is not running on {socket_path}"
    except RequestTimeout as exc:
        return not_answering(exc)
    except CapsuleError as exc:
        return f"capsuled on {socket_path} could not be asked ({exc})"
    return None


def _at_exit(
    args: argparse.Namespace,
    socket_path: Path,
    session_id: str,
    launcher: tuple[int, int],
    home: Path,
    launch: Launch,
) -> None:
    """One more look; the report, or ``--terminate-on-exit``, or ``--wait``."""
    try:
        with Client(socket_path, timeout_s=args.timeout) as client:
            left = _leftovers(client, session_id, launcher[0])
            if not left:
                return
            if args.terminate_on_exit is not None:
                release_launcher(home, *launcher)
                _terminate(client, session_id, args.terminate_on_exit)
                return
    except DaemonNotRunning:
        _say(f"capsuled stopped on {socket_path}: no look at the command's exit, no report")
        return
    except (CapsuleError, OSError, sqlite3.Error) as exc:
        _say(f"the look at the command's exit failed: {exc}")
        return
    print(render_leftovers(session_id, left, time.time()), file=sys.stderr, flush=True)
    if args.wait:
        _say("waiting for them to exit (TERM, INT or HUP stops waiting)")
        if launch.wait_for_tree():
            _say(f"session {one_line(session_id)}: every process has exited")
        else:
            _say(f"stopped waiting; stop them with: capsulectl terminate {one_line(session_id)}")
    else:
        _say(f"stop them with: capsulectl terminate {one_line(session_id)}")


def _leftovers(client: Client, session_id: str, launcher_pid: int) -> list[SessionProcess]:
    """The session's live processes but the launcher, in a fresh observation (§5)."""
    try:
        snapshot = client.snapshot(fresh=True, commands=True)
    except InvalidParams:  # a daemon older than ``commands``: the argv is read here instead
        snapshot = client.snapshot(fresh=True)
    for session in snapshot.sessions:
        if session.session_id == session_id:
            return [p for p in session.processes if p.pid != launcher_pid]
    return []


def _terminate(client: Client, session_id: str, grace_s: float) -> None:
    try:
        report = client.terminate(session_id, grace_s=grace_s)
    except NoSuchSession:
        _say(f"session {one_line(session_id)}: nothing left to terminate")
        return
    counts: dict[str, int] = {}
    for process in report.processes:
        counts[process.outcome] = counts.get(process.outcome, 0) + 1
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    processes = counted(len(report.processes), "process")
    _say(
        f"terminated session {one_line(session_id)}: {processes} in "
        f"{report.duration_ms / 1000:.1f} s: {summary or 'none left'}"
    )


def process_command_line(process: SessionProcess) -> str:
    """The process's command line as ``capsulectl sessions`` shows it (made inert): its
    argv as the daemon read it (``commands: true``), else as ``/proc/<pid>/cmdline``
    says now (read as the daemon reads it), else what its receipt says, else ``?``."""
    line = command_text(process.command)
    if line is None:
        try:
            raw = Path(f"/proc/{process.pid}/cmdline").read_bytes().rstrip(b"\0")
        except OSError:
            raw = b""
        line = command_text(argv_of(raw) if raw else None)
    if line is not None:
        return line
    if isinstance(process.receipt_command, str):
        return one_line(process.receipt_command)
    return "?"


def render_leftovers(session_id: str, processes: list[SessionProcess], now_s: float) -> str:
    """The report at CMD's exit: a heading, then one line per process (pid, age, command)."""
    count = len(processes)
    lines = [
        f"capsulectl run: session {one_line(session_id)} still has {count} "
        f"process{'' if count == 1 else 'es'}:"
    ]
    width = max(len(str(p.pid)) for p in processes)
    for process in sorted(processes, key=lambda p: p.pid):
        age = duration(max(now_s - process.started_at, 0.0))
        lines.append(f"  {process.pid:>{width}}  {age:>5}  {process_command_line(process)}")
    return "\n".join(lines)
