"""``capsulectl terminate --ended [--older-than D] [--dry-run]``: every ended session's
leftovers (docs/design.md §13).

One read-your-writes snapshot says which sessions are ended; each is then
terminated by its own ``session.terminate`` with ``ended_only``, so the
daemon checks again, in a fresh observation of its own, that the session is
still ended before it signals anything: a session resumed meanwhile is not
touched. ``--older-than`` keeps the sessions that ended at least that long
before the snapshot (by the daemon's clock, which stamped ``ended_at``).
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Final, TextIO

from ..client import Client
from ..errors import NoSuchSession, RemoteError
from ..wire import Session, TerminateReport
from .exits import EXIT_OK, EXIT_REMOTE_ERROR
from .render.ended import Outcome, render_outcomes, render_plan
from .render.output import print_json, say_unsettled
from .render.tree import terminal_width

__all__ = ["duration_s", "ended_arguments", "terminate_ended", "usage_error"]

#: Seconds in each unit ``--older-than`` takes.
UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def duration_s(text: str) -> float:
    """``--older-than``: a number and a unit, ``30s``, ``10m``, ``2h``, ``1d`` (none:
    seconds), as seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"must be a duration such as 30s, 10m, 2h or 1d, not {text!r}"
        )
    return float(match[1]) * UNITS[match[2] or "s"]


def ended_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ended [--older-than D] [--dry-run]``."""
    parser.add_argument(
        "--ended",
        action="store_true",
        help="instead of SESSION: the leftovers of every ended session (its own processes "
        "gone, only what it started left), one report each; a running session is not touched",
    )
    parser.add_argument(
        "--older-than",
        type=duration_s,
        metavar="D",
        help="with --ended: only sessions that ended at least D ago (30s, 10m, 2h, 1d)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="with --ended: list what would be stopped, and stop nothing",
    )


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the combination of ``args`` (a usage error, exit 2), or None."""
    if args.ended and args.session_id is not None:
        return "give SESSION or --ended, not both"
    if not args.ended and args.session_id is None:
        return "give a SESSION (ses_...) or --ended"
    if not args.ended and (args.older_than is not None or args.dry_run):
        return "--older-than and --dry-run go with --ended"
    return None


def _chosen(args: argparse.Namespace, sessions: list[Session], now_s: float) -> list[Session]:
    """The ended sessions ``--older-than`` keeps (all of them without it)."""
    ended = [s for s in sessions if s.state == "ended"]
    if args.older_than is None:
        return ended
    return [
        s
        for s in ended
        if isinstance(s.ended_at, (int, float)) and now_s - s.ended_at >= args.older_than
    ]


def terminate_ended(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Terminate every ended session's leftovers (``--dry-run``: list them); 0, or 1 when
    a terminate failed or discovery could not say which sessions ended."""
    snapshot = client.snapshot(fresh=True, commands=True)
    if say_unsettled(snapshot.discovery, snapshot.gaps):  # not "no ended session": nothing
        return EXIT_REMOTE_ERROR  # was stopped
    now_s = snapshot.observed_at
    chosen = _chosen(args, snapshot.sessions, now_s)
    width = None if args.wide else terminal_width(out)
    if args.dry_run:
        if args.json:
            from .render.tables import JSON_ENCODER

            out.write(JSON_ENCODER.encode(chosen).decode() + "\n")
        else:
            print(render_plan(chosen, snapshot.sessions, args.older_than, now_s, width), file=out)
        return EXIT_OK
    outcomes = [_terminate(client, session, args) for session in chosen]
    if args.json:
        parts = [o.raw if o.raw is not None else o.error_json() for o in outcomes]
        print_json(out, b"[" + b",".join(parts) + b"]")
    else:
        print(
            render_outcomes(outcomes, snapshot.sessions, args.older_than, now_s, width, args.wide),
            file=out,
        )
    return EXIT_REMOTE_ERROR if any(o.failed for o in outcomes) else EXIT_OK


def _terminate(client: Client, session: Session, args: argparse.Namespace) -> Outcome:
    """One session's ``session.terminate`` with ``ended_only``, and what came of it."""
    from .. import calls

    call = calls.terminate(
        session.session_id,
        signal=args.signal,
        grace_s=args.grace,
        commands=True,
        ended_only=True,
    )
    try:
        raw = client.call_raw(call.method, call.params, min_timeout_s=call.min_timeout_s)
    except NoSuchSession as exc:
        data: Any = exc.data
        running = isinstance(data, dict) and data.get("state") == "running"
        return Outcome(session, error=exc, running=running)
    except RemoteError as exc:
        return Outcome(session, error=exc)
    import msgspec

    return Outcome(session, report=msgspec.json.decode(raw, type=TerminateReport), raw=raw)
